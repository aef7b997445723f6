"""The DAG files users run: no import errors, nothing heavy at parse time, one lifecycle built by shared code."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_DAGS

LIFECYCLE = [
    "preflight",
    "reserve_run_path",
    "health_gate",
    "claim_nodes",
    "fabric_ready",
    "train",
    "verify_checkpoint",
    "return_capacity",
]


def dag_bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(REPO_DAGS))


def test_dags_folder_has_no_import_errors_and_both_dags_run_the_same_lifecycle(airflow_db):
    bag = dag_bag()

    assert bag.import_errors == {}
    for dag_id in ("training_lifecycle", "scheduled_retraining"):
        dag = bag.get_dag(dag_id)
        assert [t.task_id for t in dag.topological_sort()] == LIFECYCLE
        assert dag.doc_md and all(task.doc_md for task in dag.tasks)
        assert dag.get_task("return_capacity").is_teardown
        assert dag.get_task("claim_nodes").is_setup
        assert all(param.description for param in dag.params.values())
        assert [a.name for a in dag.get_task("verify_checkpoint").outlets] == [
            f"trainops/{dag_id}/final-checkpoint"
        ]


def test_a_clear_on_train_re_runs_the_gate_and_the_claim_and_a_failed_teardown_fails_the_run(airflow_db):
    dag = dag_bag().get_dag("training_lifecycle")

    def cleared(task_id: str) -> set[str]:
        """What Airflow's Clear of one task runs: the task, its relevant setups and their teardowns."""
        subset = dag.partial_subset(task_ids={task_id}, include_downstream=False, include_upstream=False)
        return set(subset.task_dict)

    # the run path stays reserved: a Clear does not reserve it again
    assert cleared("train") == {"health_gate", "claim_nodes", "fabric_ready", "train", "return_capacity"}
    # re-verifying the checkpoint holds no GPUs: no gate, no claim, no fabric check
    assert cleared("verify_checkpoint") == {"verify_checkpoint"}
    teardown = dag.get_task("return_capacity")
    assert teardown.is_teardown and teardown.on_failure_fail_dagrun and teardown.retries > 0


def test_scheduled_retraining_runs_on_a_cron_and_when_training_data_is_updated(airflow_db):
    from airflow.sdk import AssetOrTimeSchedule

    timetable = dag_bag().get_dag("scheduled_retraining").timetable
    assert isinstance(timetable, AssetOrTimeSchedule)
    assert timetable.timetable.expression == "0 3 * * 0"
    assert [asset.name for asset in timetable.asset_condition.objects] == ["training-data"]


def test_parsing_the_dag_files_loads_no_kubernetes_boto3_or_pynvml():
    heavy = ["kubernetes", "kubernetes_asyncio", "boto3", "botocore", "pynvml"]
    script = (
        "import json, runpy, sys\n"
        f"for path in {sorted(str(p) for p in REPO_DAGS.glob('*.py'))!r}:\n"
        "    runpy.run_path(path)\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
