"""Retrain on a schedule and whenever new training data lands: the training lifecycle, same tasks.

Runs every Sunday at 03:00 UTC and each time the ``training-data`` Asset is updated (a data pipeline
that lists it in its ``outlets``). Each run writes its checkpoints under a run path of its own,
``<checkpoint_uri>/scheduled-retraining-<run date>-<time>-<hash>/`` (``run_name`` left empty is derived
from the DAG run), so a run never resumes from an earlier run's checkpoints.
"""

from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable
from trainops.operators.lifecycle import LIFECYCLE_DOC, lifecycle_params, training_lifecycle

# Producers list Asset("training-data") in their outlets. Named without a URI scheme, which would load
# every provider's URI handlers (boto3 among them) at parse time.
TRAINING_DATA = Asset(name="training-data")

with DAG(
    "scheduled_retraining",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 3 * * 0", timezone="UTC"), assets=[TRAINING_DATA]
    ),
    catchup=False,
    max_active_runs=1,
    params=lifecycle_params(),
    doc_md=__doc__ + LIFECYCLE_DOC,
    render_template_as_native_obj=True,
    tags=["trainops", "training", "scheduled"],
):
    training_lifecycle("scheduled_retraining")
