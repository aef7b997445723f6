"""A node is blamed only on its own word: GPU errors the trainer printed are a hint, not evidence."""

from __future__ import annotations

from tests.training.conftest import claimed_run, heartbeat_step, idle_nodes, jobs, node, when
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


def test_a_node_that_reports_its_fault_after_the_pods_failed_is_blamed_once_it_does(cluster, api, s3, bucket):
    """The pods died printing an XID, the node's probe reports it a round later: the judgement waits on a
    watch of the nodes and blames the node when its report lands (not the user's code).  The XID reaches
    the node only once the judgement has read the nodes for the wait, so only the watch can see it."""
    from tests.devcluster.ctrl_support import wait_for
    from tests.training.conftest import training_run
    from trainops.training.decide import Follow
    from trainops.training.follow import Outcome, Status

    kube, spec = claimed_run(
        cluster, api, bucket, "late-report", ["--steps", "400", "--step-seconds", "0.05"]
    )
    nodes = list(spec.node_names)
    run = training_run(kube, spec, "late-report", evidence_wait_s=60)
    cluster_calls = run.cluster
    record = run.reconcile().attempt
    pod = wait_for(lambda: running_pod(api, "1"), "a running pod")
    culprit = pod["spec"]["nodeName"]
    cluster.inject(
        "crash-pod",
        f"training/{pod['metadata']['name']}",
        exit_code=1,
        message="NVRM: Xid 79, GPU has fallen off the bus",
    )
    wait_for(
        lambda: any(p["status"]["phase"] == "Failed" for p in cluster_calls.job_pods("training", record.job)),
        "the pod failed",
    )
    watched = cluster_calls.node_changes

    def node_changes(names, until):  # the node's report comes after the wait's first reading
        readings = watched(names, until)
        yield next(readings)
        cluster.inject("xid", culprit, code=79)
        yield from readings

    cluster_calls.node_changes = node_changes

    run.followed = record
    action = run.reconcile(
        seen=Outcome(
            Status.FAILED, "a pod failed", record.job, cluster_calls.job_pods("training", record.job)
        )
    )

    assert isinstance(action, Follow) and action.attempt.number == 2, action  # resumed
    judged = run.observe().attempts[0].end
    assert judged.verdict == "resume" and judged.reason.startswith("node fault"), judged
    assert run.observe().excluded.keys() == {culprit} and action.attempt.kept_out.keys() == {culprit}
    assert node(api, culprit)["metadata"]["labels"][HEALTH_LABEL] == "quarantined"
    assert not any(
        HEALTH_LABEL in (node(api, n)["metadata"].get("labels") or {}) for n in nodes if n != culprit
    )


def test_waiting_for_a_nodes_report_leaves_the_triggerers_shared_threads_free(cluster, api, s3, bucket):
    """The trigger judges in threads of its own: a judgement that waits for the nodes' reports does not
    hold the event loop's default executor, which every trigger in the triggerer shares (here one
    thread, so a judgement in it would hold back the other trigger's call until it ends)."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from tests.devcluster.ctrl_support import wait_for
    from tests.training.conftest import training_run
    from trainops.training.decide import Fail
    from trainops.training.follow import Outcome, Status

    kube, spec = claimed_run(cluster, api, bucket, "shared", ["--steps", "400", "--step-seconds", "0.05"])
    run = training_run(kube, spec, "shared", evidence_wait_s=3, unconfirmed_fault_retries=0)
    cluster_calls = run.cluster
    waiting = threading.Event()
    watched = cluster_calls.node_changes

    def node_changes(names, until):  # no node reports: the judgement waits the whole evidence_wait_s
        waiting.set()
        yield from watched(names, until)

    cluster_calls.node_changes = node_changes

    def crash_and_wait(attempt) -> Outcome:
        job = attempt.job
        pod = wait_for(lambda: running_pod(api, "1"), "a running pod")
        cluster.inject(
            "crash-pod",
            f"training/{pod['metadata']['name']}",
            exit_code=1,
            message="NVRM: Xid 79, GPU has fallen off the bus",
        )
        pods = wait_for(
            lambda: (
                [p for p in cluster_calls.job_pods("training", job) if p["status"]["phase"] == "Failed"]
                and cluster_calls.job_pods("training", job)
            ),
            "the pod failed",
        )
        return Outcome(Status.FAILED, "a pod failed", job, pods)

    async def follow_attempt(attempt) -> Outcome:
        return await asyncio.to_thread(crash_and_wait, attempt)

    async def triggerer() -> tuple[bool, object]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        judged = asyncio.Event()

        async def judge():
            action = await run.follow_to_end(follow_attempt)
            judged.set()
            return action

        judging = asyncio.create_task(judge())
        while not waiting.is_set():
            await asyncio.sleep(0.05)
        await asyncio.to_thread(lambda: None)  # another trigger's call
        return judged.is_set(), await judging

    judged_first, action = asyncio.run(triggerer())

    assert isinstance(action, Fail)  # nobody confirmed the XID: the user's code
    assert not judged_first, "another trigger's call waited for the judgement"
