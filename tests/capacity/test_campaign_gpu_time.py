"""The campaign's GPU-second accounting on plain timelines: every held GPU-second is useful, the policy's
fault-free set-up, or lost to a cause."""

from __future__ import annotations

import pytest

from benchmarks.campaign.gpu_time import AttemptTimes, RunTimes, Setup, account

STEP_S = 0.02
NODES = {"n1": [(0.0, 10.0)], "n2": [(0.0, 10.0)], "n3": [(0.0, 10.0)]}  # 3 nodes x 8 GPUs, 0 s to 10 s


def beats(start_at: float, start_step: int, end_step: int) -> list[tuple[float, int]]:
    """A heartbeat every 5 steps from ``start_at`` (when step ``start_step`` began)."""
    return [(start_at + (s - start_step) * STEP_S, s) for s in range(start_step + 5, end_step + 1, 5)]


def fault_free() -> RunTimes:
    return RunTimes(NODES, [AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 100))], gang_gpus=16, final_step=100)


SETUP = Setup.measured([account(fault_free())])


def test_a_run_without_faults_pays_the_claim_start_spare_and_teardown_and_loses_nothing_beyond_them():
    result = account(fault_free())

    assert result.held == pytest.approx(240)
    assert result.useful == pytest.approx(16 * 2.0)
    causes = {
        k: pytest.approx(v) for k, v in {"claim": 48, "start": 24, "spare": 16, "teardown": 120}.items()
    }
    assert {k: v for k, v in result.causes.items() if v} == causes
    assert SETUP.total == pytest.approx(208) and result.lost(SETUP) == pytest.approx(0)
    assert result.lost(Setup()) == pytest.approx(240 - 32)  # nothing measured: all but the useful is lost


def test_a_fault_that_delays_the_first_step_is_lost_under_start_not_hidden_as_set_up():
    late = AttemptTimes("a1", 2.0, beats=beats(4.0, 0, 100))  # its first step a second later (a requeue)
    run = RunTimes({n: [(0.0, 11.0)] for n in NODES}, [late], gang_gpus=16, final_step=100)

    result = account(run)

    assert result.charged(SETUP)["start"] == pytest.approx(24 * 1.0)
    assert result.lost(SETUP) == pytest.approx(24 * 1.0)
    assert result.held == pytest.approx(result.useful + SETUP.total + result.lost(SETUP))


def test_runs_added_up_are_charged_beyond_one_set_up_each_and_a_run_that_held_nothing_beyond_none():
    total = account(fault_free())
    total.add(account(fault_free()))
    total.add(account(RunTimes({}, [], gang_gpus=16)))

    assert total.setups == 2
    assert total.lost(SETUP) == pytest.approx(0)


def test_a_crash_costs_detection_judgement_readmission_waiting_rendezvous_and_the_steps_done_again():
    first = AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 50), failed_at=4.0, detected=4.1)  # step 50 at 4.0
    second = AttemptTimes(
        "a2", 5.0, start_step=40, admitted=5.2, running=5.5, beats=beats(6.0, 40, 100)
    )  # resumed from the step-40 checkpoint, written at 3.8
    run = RunTimes(NODES, [first, second], gang_gpus=16, final_step=100)

    result = account(run)

    lost = {
        "recomputed": 16 * 0.2,
        "detection": 24 * 0.1,
        "judgement": 24 * 0.9,
        "re-admission": 24 * 0.2,
        "waiting for nodes": 24 * 0.3,
        "re-rendezvous": 24 * 0.5,
    }
    assert {k: result.causes[k] for k in lost} == {k: pytest.approx(v) for k, v in lost.items()}
    assert result.useful == pytest.approx(16 * 100 * STEP_S)
    assert result.held == pytest.approx(result.useful + SETUP.total + result.lost(SETUP))
    assert result.recoveries == [pytest.approx(6.1 - 4.0)]  # to the first heartbeat past step 40
    assert result.redone_steps == 10  # steps 41-50, counted as steps as well as in GPU-seconds


def test_a_failed_run_has_no_useful_steps_and_what_follows_its_last_failure_is_failed():
    first = AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 50), failed_at=4.0, detected=4.5)
    torn = AttemptTimes("a2", 5.0, start_step=40, admitted=5.1, running=5.3, failed_at=5.6, detected=6.0)
    run = RunTimes(NODES, [first, torn], gang_gpus=16, succeeded=False, final_step=100)

    result = account(run)

    assert result.useful == 0
    assert result.causes["recomputed"] == pytest.approx(16 * 1.0)
    assert result.causes["re-rendezvous"] == pytest.approx(24 * 0.3)  # it started, then failed loading
    assert result.causes["failed"] == pytest.approx(24 * 4.0)
    assert result.lost(SETUP) == pytest.approx(result.held - SETUP.total)  # all of it but the set-up


def test_a_killed_return_waiting_for_its_retry_is_the_dead_workers():
    def returned(dead: list[tuple[float, float]], waited: float) -> RunTimes:
        return RunTimes(
            {"n1": [(0.0, 7.0 + waited)], "n2": [(0.0, 10.0 + waited)]},
            [AttemptTimes("a1", 1.0, beats=beats(2.0, 0, 100))],
            gang_gpus=8,
            final_step=100,
            dead=dead,
        )

    result = account(returned([(6.0, 8.0)], waited=2.0))  # the return killed at 6.0, retried at 8.0

    # 4.0 -> 6.0 and 8.0 -> 9.0 on both nodes, then n2 alone to 12.0
    assert result.causes["teardown"] == pytest.approx(16 * 2.0 + 16 * 1.0 + 8 * 3.0)
    assert result.causes["dead worker"] == pytest.approx(16 * 2.0)
    not_killed = Setup.measured([account(returned([], waited=0.0))])
    assert result.lost(not_killed) == pytest.approx(result.causes["dead worker"])


def test_steps_on_a_gpu_at_half_speed_lose_half_their_time():
    slowed = AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 100), speed=0.5)
    result = account(RunTimes(NODES, [slowed], gang_gpus=16, final_step=100))

    assert result.useful == result.causes["slow steps"] == pytest.approx(16 * 1.0)


def test_what_a_run_pays_anyway_while_its_task_has_no_worker_is_the_dead_workers():
    trained = AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 100))  # trained to step 100 by 5.0
    run = RunTimes(NODES, [trained], gang_gpus=16, final_step=100, dead=[(1.0, 1.5), (4.0, 8.0)])

    result = account(run)

    assert result.causes["dead worker"] == pytest.approx(24 * 0.5 + 24 * 3.0)  # the training itself went on
    assert result.causes["claim"] == pytest.approx(24 * 1.5) and result.causes["teardown"] == pytest.approx(
        48
    )


def test_a_run_held_far_longer_than_a_fault_free_one_is_a_violation_however_its_checks_held():
    from benchmarks.campaign import ELAPSED_BOUND, Report
    from benchmarks.campaign.lifecycle import RunResult

    def run(index: int, fault: str, until: float) -> RunResult:
        nodes = {n: [(0.0, until)] for n in NODES}
        times = RunTimes(
            nodes, [AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 100))], gang_gpus=16, final_step=100
        )
        return RunResult(index, fault, "succeeded", landed=True, account=account(times))

    slow = ELAPSED_BOUND * 10.0 + 1.0  # held past the bound: a start 50x slower would be
    report = Report(runs=[run(0, "none", 10.0), run(1, "xid", 40.0), run(2, "hang", slow)])

    assert report.violations == [
        f"run 2 (hang): held {24 * slow:.0f} GPU-s, {slow / 10:.1f}x a fault-free run's 240 (bound {ELAPSED_BOUND:g}x)"
    ]
    assert report.to_dict()["elapsed"]["longest"] == {"run": 2, "fault": "hang", "ratio": round(slow / 10, 2)}


def test_the_defaults_baseline_holds_its_pool_through_each_retrys_longer_wait_and_is_reported_beside():
    from benchmarks.campaign import Report
    from benchmarks.campaign.baseline import BaselineResult
    from benchmarks.campaign.lifecycle import RunResult
    from benchmarks.campaign.readme import defaults

    def run(index: int, fault: str, until: float, attempts: int) -> RunResult:
        times = RunTimes(
            {n: [(0.0, until)] for n in NODES},
            [AttemptTimes("a1", 2.0, beats=beats(3.0, 0, 100))],
            gang_gpus=16,
            final_step=100,
        )
        base = BaselineResult("success", True, True, account(times), attempts)
        return RunResult(index, fault, "succeeded", landed=True, account=account(times), baseline=base)

    report = Report(runs=[run(0, "none", 10.0, 1), run(1, "xid", 20.0, 2), run(2, "xid", 20.0, 3)])
    found = report.to_dict()["defaults_baseline"]

    wait = (300 - 5) / 60  # campaign seconds more per retry, on a pool of the gang and a spare (3 x 8 GPUs)
    assert found["retry_delay_s"] == 300 and found["pool_gpus"] == 24
    infrastructure = found["infrastructure"]  # the two xid runs, each 10 s x 24 GPUs beyond a fault-free run
    assert infrastructure["retries"] == 3
    assert infrastructure["lost_gpu_s"] == pytest.approx(2 * 240 + 3 * wait * 24, abs=0.1)
    assert infrastructure["ratio"] == pytest.approx(480 / (480 + 3 * wait * 24), abs=0.001)
    assert "not run" in defaults(found)[1] and "3 retries" in defaults(found)[1]
