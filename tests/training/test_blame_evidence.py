"""A node is blamed only on its own word: GPU errors the trainer printed are a hint, not evidence."""

from __future__ import annotations

from tests.training.conftest import heartbeat_step, idle_nodes, jobs, node, when
from tests.training.test_gang_e2e import conf, running_pod, task_state
from trainops.conventions import HEALTH_LABEL

ILLEGAL_ACCESS = "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_cuda_error_in_the_users_output_quarantines_nothing_resumes_once_then_fails_as_user_code(
    cluster, api, s3, bucket, run_dag, capfd
):
    nodes, run_uri = idle_nodes(api), f"s3://{bucket}/runs/illegal-access/"

    def crash(attempt: str) -> None:
        pod = running_pod(api, attempt)
        cluster.inject(
            "crash-pod", f"training/{pod['metadata']['name']}", exit_code=1, message=ILLEGAL_ACCESS
        )

    # the same unconfirmed GPU error twice: once is the small budget of its own (a resume, nobody
    # blamed), the second time it is the user's code
    when(lambda: heartbeat_step(s3, run_uri) >= 20 and running_pod(api, "1") is not None, lambda: crash("1"))
    when(lambda: running_pod(api, "2") is not None, lambda: crash("2"))
    dag_run = run_dag("gang_training_e2e", conf(nodes, run_uri))

    assert dag_run.state == "failed"
    assert task_state(dag_run, "train").try_number == 1  # the trigger resumed, within the try
    assert len(jobs(api)) == 2
    for name in nodes:
        assert HEALTH_LABEL not in (node(api, name)["metadata"].get("labels") or {}), f"{name} quarantined"
    log = capfd.readouterr().out
    assert "hint (not evidence against a node)" in log and "an illegal memory access" in log
    assert "unconfirmed fault (1 of 1 such retries)" in log
    assert "user code failed (no resume used)" in log
    assert task_state(dag_run, "give_back").state == "success"
