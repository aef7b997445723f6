"""The campaign's projection to a realistic scale: Llama 3's failure rate and causes, the Young–Daly interval,
and each policy's measured stand-still and redone share carried to them."""

from __future__ import annotations

import pytest

from benchmarks.campaign.scale import GPUS, MIX, SAVE_S, at_scale
from benchmarks.campaign.steps import CHECKPOINT_EVERY, GANG
from trainops.checkpoints.interval import LLAMA3_GPU_HOURS_PER_FAILURE, daly_interval

GANG_GPUS = GANG * 8


def entry(kind: str, still: float, redone: float, *, baseline_still: float, violations=()) -> dict:
    """A ``per_run`` entry whose gang stood still ``still`` campaign seconds and redid ``redone`` intervals."""

    def policy(still_s: float, recomputed_gpu_s: float) -> dict:
        causes = {
            "detection": still_s * GANG_GPUS / 2,
            "judgement": still_s * GANG_GPUS / 2,
            "spare": 99.0,  # the spare's time is not the gang standing still
            "recomputed": recomputed_gpu_s,  # nor the steps done again: counted in steps
        }
        return {"lost_by_cause_gpu_s": causes, "redone_steps": round(redone * CHECKPOINT_EVERY)}

    return {
        "fault": kind,
        "landed": True,
        "violations": list(violations),
        "trainops": policy(still, recomputed_gpu_s=9.0),  # slower steps redone than the baseline's ...
        "baseline": policy(baseline_still, recomputed_gpu_s=3.0),  # ... cost the same share at scale
    }


def test_each_failure_costs_its_stand_still_scaled_and_its_redone_share_of_the_interval_at_scale():
    runs = [entry(kind, 1.0, 0.5, baseline_still=3.0) for kind in MIX]
    runs.append(entry("xid", 100.0, 9.0, baseline_still=100.0, violations=["unchecked"]))  # left out

    result = at_scale(runs, scale=60)

    mtbf_h = LLAMA3_GPU_HOURS_PER_FAILURE / GPUS
    interval = daly_interval(SAVE_S, mtbf_h * 3600)
    assert result["mtbf_h"] == pytest.approx(mtbf_h, abs=0.01)
    assert result["interval_s"] == pytest.approx(interval, abs=0.1)
    ours, theirs = 60 + 0.5 * interval, 180 + 0.5 * interval
    for row in result["by_kind"].values():
        assert row["trainops"]["cost_s"] == pytest.approx(ours, abs=0.1)
        assert row["baseline"]["cost_s"] == pytest.approx(theirs, abs=0.1)
    # every failure of the job costs the job's GPUs its cost: per 1,000 GPU-hours held, 1,000 x rate x cost
    assert result["lost_per_1000"]["trainops"] == pytest.approx(1000 / mtbf_h * ours / 3600, abs=0.01)
    assert result["ratio"] == pytest.approx(ours / theirs, abs=0.001)


def test_no_projection_without_a_measured_run_of_every_kind_it_weighs():
    runs = [entry(kind, 1.0, 0.5, baseline_still=3.0) for kind in MIX if kind != "hang"]
    assert at_scale(runs, scale=60) is None
