"""Train a model on GPU nodes borrowed from inference: health gate -> claim -> train -> verify -> return.

Trigger it with the form (every field is described there); the defaults run the demo trainer on the
devcluster (`trainops devcluster up`). The tasks are built by ``trainops.operators.lifecycle``.
"""

from airflow.sdk import DAG
from trainops.operators.lifecycle import LIFECYCLE_DOC, lifecycle_params, training_lifecycle

with DAG(
    "training_lifecycle",
    schedule=None,
    params=lifecycle_params(),
    doc_md=LIFECYCLE_DOC,
    render_template_as_native_obj=True,
    max_active_runs=4,
    tags=["trainops", "training"],
):
    training_lifecycle("training_lifecycle")
