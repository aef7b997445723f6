"""Checkpoint-interval advice (Young–Daly) against the published worked examples."""

import pytest

from trainops.checkpoints.interval import LLAMA3_GPU_HOURS_PER_FAILURE, advise, daly_interval, waste


@pytest.mark.parametrize(
    ("save_s", "mtbf_h", "minutes"),
    [(300, 24, 117), (300, 6, 57)],  # Daly 2006's worked examples (delta = 5 min)
)
def test_daly_interval_matches_the_papers_examples(save_s, mtbf_h, minutes):
    assert daly_interval(save_s, mtbf_h * 3600) / 60 == pytest.approx(minutes, abs=1)


def test_a_save_longer_than_twice_the_mtbf_checkpoints_once_per_mtbf():
    assert daly_interval(500, 200) == 200


def test_with_no_failure_seen_a_4096_gpu_run_gets_llama3s_rate_and_saves_every_27_minutes():
    advice = advise(save_s=30, gpus=4096, failures=0, gpu_hours=0, used_s=3600)

    assert (
        advice.mtbf_s / 3600
        == pytest.approx(LLAMA3_GPU_HOURS_PER_FAILURE / 4096)
        == pytest.approx(12.4, abs=0.1)
    )
    assert advice.best_s / 60 == pytest.approx(27, abs=1)  # the resilience notes' table
    assert advice.waste_best < advice.waste_used == pytest.approx(waste(3600, 30, advice.mtbf_s))
    assert advice.summary().startswith("save every 27 min")
    assert "it saves every 60 min" in advice.summary()


def test_the_fleets_own_failures_outweigh_the_prior_once_it_has_run_long_enough():
    young = advise(save_s=30, gpus=512, failures=2, gpu_hours=1_000)
    old = advise(save_s=30, gpus=512, failures=200, gpu_hours=1_000_000)
    measured = advise(save_s=30, gpus=512, failures=200, gpu_hours=1_000_000, prior=False)

    assert young.mtbf_s == pytest.approx((1_000 + LLAMA3_GPU_HOURS_PER_FAILURE) / 3 / 512 * 3600)
    assert old.mtbf_s == pytest.approx(measured.mtbf_s, rel=0.06)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"save_s": 0, "gpus": 8, "failures": 1, "gpu_hours": 1}, "save_s"),
        ({"save_s": 1, "gpus": 0, "failures": 1, "gpu_hours": 1}, "gpus"),
        ({"save_s": 1, "gpus": 8, "failures": -1, "gpu_hours": 1}, "failures"),
        ({"save_s": 1, "gpus": 8, "failures": 0, "gpu_hours": 1, "prior": False}, "failure rate"),
    ],
)
def test_bad_input_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        advise(**kwargs)
