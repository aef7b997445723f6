"""The trigger resumes a crashed run itself, and a triggerer that dies while it does loses nothing: a new
trigger, built from the same serialized kwargs (as the triggerer rebuilds it), reads the run from its
Jobs, follows the attempt the first one began instead of submitting another, and ends the run; the
first attempt's judgement is on its Job, as the first trigger recorded it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from trainops.triggers.training import GangRunTrigger

from tests.devcluster.ctrl_support import wait_for
from tests.training.conftest import claimed_run, heartbeat_step, jobs, node, training_run
from tests.training.test_gang_e2e import running_pod
from trainops.capacity.procedure import give_back
from trainops.conventions import HEALTH_LABEL
from trainops.training.progress import HangPolicy

ARGS = ["--steps", "120", "--checkpoint-every", "20", "--step-seconds", "0.05", "--heartbeat-every", "5"]


def attempts_of(api) -> list[str]:
    return sorted(j["metadata"]["labels"]["trainops.io/attempt"] for j in jobs(api))


@pytest.mark.parametrize("fault", ["xid", "hang"])
def test_a_trigger_restarted_after_it_resumed_finds_the_attempt_it_began(cluster, api, s3, bucket, fault):
    """xid: attempt 1's Job failed; hang: the trigger stopped it (Workload deactivated, the Job not failed)."""
    kube, spec = claimed_run(cluster, api, bucket, "restart", ARGS, claimed=3)  # a gang of 2 and a spare
    # As the test DAG does: a hung attempt's pods free their GPUs within the devcluster's PodsReady timeout.
    spec = dataclasses.replace(spec, termination_grace_seconds=5)
    run_uri = spec.run_path
    hang = HangPolicy(floor=3.0, startup_timeout=30.0)
    run = training_run(kube, spec, "restart", evidence_wait_s=60, max_resumes=2, hang=hang)
    first = run.reconcile().attempt
    deferred = GangRunTrigger(run.to_dict(), kubeconfig=str(cluster.kubeconfig))
    _, kwargs = deferred.serialize()

    async def first_trigger() -> None:
        """Runs until it has begun attempt 2, then the triggerer dies (a cancel, no on_kill)."""
        events = GangRunTrigger(**kwargs).run()
        pending = asyncio.ensure_future(anext(events))
        while "2" not in attempts_of(api):
            assert not pending.done(), f"the trigger ended before resuming: {pending.result().payload}"
            await asyncio.sleep(0.1)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)

    wait_for(lambda: heartbeat_step(s3, run_uri) >= 25 and running_pod(api, "1"), "attempt 1 past step 20")
    culprit = running_pod(api, "1")["spec"]["nodeName"]
    if fault == "xid":
        cluster.inject("xid", culprit, code=79)
    else:
        cluster.inject("hang", f"training/{first.job}")
    asyncio.run(first_trigger())

    async def second_trigger() -> dict:
        return (await anext(GangRunTrigger(**kwargs).run())).payload

    event = asyncio.run(second_trigger())

    assert event["status"] == "succeeded", event["message"]
    assert attempts_of(api) == ["1", "2"]  # attempt 2's Job was found, not made again
    ledger = run.observe()
    ended = "infrastructure" if fault == "xid" else "hang"
    assert [(a.number, a.end.kind) for a in ledger.attempts] == [(1, ended), (2, "succeeded")]
    assert ledger.attempts[0].end.by == ledger.attempts[1].end.by == "try 1"
    assert ledger.attempts[1].resume_from.startswith(f"{run_uri}step-")
    if fault == "xid":
        assert culprit in ledger.excluded
        assert node(api, culprit)["metadata"]["labels"][HEALTH_LABEL] == "quarantined"
    give_back(kube, "dag/restart", cluster_queue="training", training_namespace="training")
