"""The health gate in a DAG: choose nodes, then hand them on (the return value a claim task would read).

conf: min_nodes, wait_timeout_s, poll_interval_s, prometheus_conn_id, on_prometheus_unavailable,
policy_overrides, speed_tiers, fabrics, fault_window_s, resume_min_nodes, gpu_memory_gib.
"""

from airflow.sdk import dag, task
from trainops.operators.health import NodeHealthGateOperator


@dag(schedule=None, tags=["test"], render_template_as_native_obj=True)
def health_gate():
    gate = NodeHealthGateOperator(
        task_id="gate",
        min_nodes="{{ dag_run.conf.get('min_nodes', 1) }}",
        wait_timeout_s="{{ dag_run.conf.get('wait_timeout_s', 0) }}",
        poll_interval_s="{{ dag_run.conf.get('poll_interval_s', 0.5) }}",
        prometheus_conn_id="{{ dag_run.conf.get('prometheus_conn_id') }}",
        on_prometheus_unavailable="{{ dag_run.conf.get('on_prometheus_unavailable', 'fail') }}",
        policy_overrides="{{ dag_run.conf.get('policy_overrides', {}) }}",
        fabrics="{{ dag_run.conf.get('fabrics') }}",
        fault_window_s="{{ dag_run.conf.get('fault_window_s') }}",
        resume_min_nodes="{{ dag_run.conf.get('resume_min_nodes') }}",
        gpu_memory_gib="{{ dag_run.conf.get('gpu_memory_gib') }}",
    )

    @task
    def chosen(gate: dict) -> list[str]:
        return sorted(gate["node_names"])

    chosen(gate.output)


health_gate()
