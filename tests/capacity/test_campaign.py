"""The fault campaign (``make campaign``): one seeded run under both policies, its checks shown able to
fail (a harness that skips the fault counts no coverage; a lifecycle that leaks until the harness's
cleanup is a violation), and the checker shown to report broken end states."""

from __future__ import annotations

import pytest

from benchmarks.campaign import Report, world
from benchmarks.campaign.invariants import end_state, holders, run_label
from benchmarks.campaign.lifecycle import Plan, Run, gate, set_quarantine
from benchmarks.campaign.steps import GANG, Step, claim_step, give_back_step, training_run
from tests.capacity.helpers import snapshot
from trainops.checkpoints.helper import commit
from trainops.kube.client import JOBS
from trainops.training.job import build_job

pytestmark = pytest.mark.servers  # `fleet` is a devcluster, a local S3 and the trainer


@pytest.fixture(scope="module")
def fleet():
    with world(nodes=16) as w:  # the baseline's provider DAG too (tests/conftest.py configures Airflow)
        yield w


def plan(fleet, kind: str, index: int) -> Plan:
    return Plan.draw(fleet, 1, index, (kind,))


def test_a_crashed_rank_is_resumed_by_both_policies_and_each_one_is_charged_the_steps_it_redid(fleet):
    run = Run(fleet, plan(fleet, "pod-crash", 0)).go()

    assert run.violations == [], run.violations
    assert run.landed, run.notes
    assert "the run resumed (2 attempt(s))" in run.checked
    assert run.account.causes["recomputed"] > 0
    base = run.baseline
    assert base.landed and base.outcome == "success", (base.outcome, base.notes)
    assert base.attempts >= 2  # Airflow retried the failed task: a second Job
    assert base.account.causes["recomputed"] > 0
    result = Report(runs=[run]).to_dict()
    assert result["coverage"]["pod-crash"] == {"runs": 1, "landed": 1, "covered": 1}
    assert result["by_kind"]["pod-crash"]["baseline"]["lost_gpu_s"] > 0


class WithoutBaseline(Run):
    def baseline(self):
        return None


class SkipsTheFault(WithoutBaseline):
    """A harness that never strikes the training fault it drew."""

    def strike(self) -> None:
        pass


class LeaksUntilCleanup(WithoutBaseline):
    """A lifecycle that gates, claims and ends without its teardown (a second give_back would repair it)."""

    def lifecycle(self) -> None:
        self.gated = gate(self.world)
        self.chosen = self.step.nodes = list(self.gated.selected)
        self.step.nodes = self.claim_task()


def test_a_fault_the_harness_skipped_is_counted_apart_not_as_coverage(fleet):
    run = SkipsTheFault(fleet, plan(fleet, "xid", 1)).go()

    assert run.outcome == "succeeded"
    assert not run.landed
    assert run.notes[-1].startswith("did not land: no running attempt was struck"), run.notes
    result = Report(runs=[run]).to_dict()
    assert result["coverage"]["xid"] == {"runs": 1, "landed": 0, "covered": 0}
    assert result["not_landed"] == [f"run 1 (xid): {run.notes[-1]}"]


def test_a_lifecycle_that_leaves_its_nodes_for_the_harness_to_return_is_a_violation(fleet):
    leaky = LeaksUntilCleanup(fleet, plan(fleet, "none", 2))
    run = leaky.go()

    assert any(v.startswith("nodes still claimed after the run ended") for v in run.violations), (
        run.violations
    )
    assert any(v.startswith("quota still granted") for v in run.violations), run.violations
    assert any(f"the harness had to return what {leaky.step.run}" in v for v in run.violations), (
        run.violations
    )
    assert holders(fleet.cluster) == {}  # the repair returned them, for the next run


def check(fleet, before) -> list[str]:
    return end_state(fleet.cluster, fleet.recorder.take(), before, fleet.quota_before, fleet.store, ready_s=1)


def test_the_checker_reports_nodes_and_quota_held_after_the_run_ended(fleet):
    before = snapshot(fleet.cluster)
    fleet.recorder.take()
    step = Step(fleet.kubeconfig, "campaign/broken_1", "", sorted(fleet.cluster.telemetry)[: GANG + 1])
    claim_step(step)  # ... and no give_back: the run "ended" holding its nodes

    found = check(fleet, before)

    assert any("nodes still claimed" in v and "campaign/broken_1" in v for v in found), found
    assert any("quota still granted" in v for v in found), found
    assert any("the GPU quota is" in v for v in found), found
    give_back_step(step)
    assert check(fleet, before) == []


def test_the_checker_reports_a_second_job_for_one_attempt_and_a_resume_from_a_torn_checkpoint(fleet):
    before = snapshot(fleet.cluster)
    fleet.recorder.take()
    step = Step(fleet.kubeconfig, "campaign/broken_2", f"s3://{fleet.bucket}/runs/broken-2/")
    torn = f"{step.run_uri}step-20/"
    put = fleet.store.client.put_object
    put(Bucket=fleet.bucket, Key="runs/broken-2/step-20/rank-0.bin", Body=b"shard")
    commit(torn, step=20, store=fleet.store)
    put(Bucket=fleet.bucket, Key="runs/broken-2/step-20/rank-0.bin", Body=b"torn!")
    run = training_run(step, fleet.store)
    for name in ("job-a", "job-b"):  # two Jobs for attempt 1 (no quota is granted: neither is admitted)
        job = build_job(
            run.spec, name=name, dag_id="campaign", run_id="broken_2", attempt=1, resume_from=torn
        )
        run.cluster.create_job(job)

    found = check(fleet, before)

    assert any("2 Jobs for attempt 1" in v for v in found), found
    assert any(f"resumed from {torn}, which does not verify" in v for v in found), found
    for name in ("job-a", "job-b"):
        run.cluster.kube.delete(JOBS, name, "training")


def test_the_checker_reports_a_pod_on_a_quarantined_node_and_one_on_a_node_its_run_does_not_hold(fleet):
    before = snapshot(fleet.cluster)
    fleet.recorder.take()
    node = sorted(fleet.cluster.telemetry)[-1]
    set_quarantine(fleet.cluster, node, True)
    pod = {
        "metadata": {
            "name": "stray",
            "namespace": "training",
            "labels": {"trainops.io/run": run_label("c/r")},
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "x"}]},
    }
    fleet.cluster.store.create("pods", pod)

    found = check(fleet, before)

    assert any(f"pod stray bound to quarantined node {node}" in v for v in found), found
    assert any(
        f"pod stray of run {run_label('c/r')} bound to node {node} held by None" in v for v in found
    ), found
    fleet.cluster.store.delete("pods", "training", "stray")
    set_quarantine(fleet.cluster, node, False)


def test_an_nvlink_storm_ends_in_a_downed_link_that_kills_only_the_run_the_gate_did_not_keep_away(fleet):
    """The campaign's model of a replay storm (``faults.link_fails``): the link goes down mid-run."""
    lifecycle = Run(fleet, plan(fleet, "nvlink", 3))
    run, target = lifecycle.go(), lifecycle.plan.target

    assert run.violations == [], run.violations
    assert f"the gate kept {target} out" in " ".join(run.checked), run.checked
    assert lifecycle.struck.note.startswith(f"XID 74 on {target} GPU 0"), lifecycle.struck.note
    assert lifecycle.struck.note.endswith("no pod there")  # trainops' run was elsewhere: one attempt
    assert run.account.causes["recomputed"] == run.account.causes["judgement"] == 0
    base = run.baseline
    assert base.landed and base.outcome == "success", (base.outcome, base.notes)
    # the baseline, which never looks, ran a rank there: it died with the link and Airflow retried elsewhere
    assert base.notes[0].startswith(
        f"XID 74 on {target} GPU 0 at step 50: killed training/job-bench-provider-"
    )
    assert base.attempts == 2
    assert base.account.causes["recomputed"] > 0 and base.account.causes["judgement"] > 0
