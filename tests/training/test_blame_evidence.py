"""A node is blamed only on its own word: GPU errors the trainer printed are a hint, not evidence."""

from __future__ import annotations

from tests.training.conftest import heartbeat_step, idle_nodes, jobs, node, pods, when
from tests.training.test_gang_e2e import conf, running_pod, task_state
from trainops.conventions import HEALTH_LABEL

ILLEGAL_ACCESS = "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_cuda_error_in_the_users_output_quarantines_nothing_and_fails_as_user_code(
    cluster, api, s3, bucket, run_dag, capfd
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/illegal-access/"

    def crash_rank0() -> None:
        pod = running_pod(api, "1")
        cluster.inject(
            "crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message=ILLEGAL_ACCESS
        )

    when(lambda: heartbeat_step(s3, run_uri) >= 20 and running_pod(api, "1") is not None, crash_rank0)
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "failed"
    assert task_state(dag_run, "train").try_number == 1  # the user's code: no resume used
    assert len(jobs(api)) == 1
    for name in nodes:
        assert HEALTH_LABEL not in (node(api, name)["metadata"].get("labels") or {}), f"{name} quarantined"
    log = capfd.readouterr().out
    assert "hint (not evidence against a node)" in log and "an illegal memory access" in log
    assert task_state(dag_run, "give_back").state == "success"
    assert {p["metadata"]["labels"]["trainops.io/attempt"] for p in pods(api)} <= {"1"}
