"""The GPU-side and fabric-side health sensors, deferrable, on the nodes named in conf.

conf: gpu_nodes, fabric_nodes (lists of node names).
"""

from airflow.sdk import dag
from trainops.sensors.health import FabricHealthSensor, GpuHealthSensor


@dag(schedule=None, tags=["test"], render_template_as_native_obj=True)
def health_sensors():
    GpuHealthSensor(
        task_id="gpus", node_names="{{ dag_run.conf['gpu_nodes'] }}", timeout=3, poke_interval=0.5
    )
    FabricHealthSensor(
        task_id="fabric", node_names="{{ dag_run.conf['fabric_nodes'] }}", timeout=3, poke_interval=0.5
    )


health_sensors()
