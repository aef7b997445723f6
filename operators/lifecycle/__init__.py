"""The training lifecycle as one piece that DAGs reuse.

    with DAG("training_lifecycle", params=lifecycle_params(), doc_md=LIFECYCLE_DOC,
             render_template_as_native_obj=True, schedule=None):
        training_lifecycle("training_lifecycle")

Where things are: the trigger form (every param, its default and schema) in ``params.py``; what
the UI shows for the DAG and each task in ``docs.py``; the task chain in ``dag.py``; its task ids (which
the UI plugin reads too) in ``task_ids.py``.
"""

from trainops.operators.lifecycle.dag import RUN_PATH, final_checkpoint_asset, training_lifecycle
from trainops.operators.lifecycle.docs import LIFECYCLE_DOC
from trainops.operators.lifecycle.params import lifecycle_params

__all__ = ["LIFECYCLE_DOC", "RUN_PATH", "final_checkpoint_asset", "lifecycle_params", "training_lifecycle"]
