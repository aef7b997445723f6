"""The run view's rate counts only the current attempt's progress, also when the attempt was resumed
within the second of the last commits before the crash (Job creation times have whole seconds); its
checkpoint-interval advice."""

from __future__ import annotations

import pytest
from trainops.plugins.progress import heartbeat_rate, interval_advice


def test_commits_before_the_resume_step_are_not_the_resumed_attempts_progress():
    attempt = {"number": 2, "started_at": 100.0, "resume_step": 20}  # created at 100.7, shown as 100
    commits = [{"step": 10, "at": 100.2}, {"step": 20, "at": 100.6}, {"step": 30, "at": 102.0}]

    rate = heartbeat_rate({"step": 40, "at": 103.0}, commits, attempt)

    assert rate["step"] == 30 and rate["steps_per_s"] == 10.0


def test_without_a_commit_of_its_own_the_rate_runs_from_where_the_attempt_resumed():
    attempt = {"number": 2, "started_at": 100.0, "resume_step": 20}
    commits = [{"step": 10, "at": 100.2}, {"step": 20, "at": 100.6}]

    rate = heartbeat_rate({"step": 25, "at": 101.0}, commits, attempt)

    assert rate["step"] == 20 and rate["at"] == 100.0 and rate["steps_per_s"] == 5.0


def test_the_interval_advice_weighs_the_runs_save_time_and_failures_against_the_interval_it_used():
    ledger = {
        "attempts": [
            {"created_at": 0.0, "ended_at": 3600.0, "nodes": 64, "kind": "infrastructure"},
            {"created_at": 3700.0, "ended_at": None, "nodes": 64, "kind": None},
        ]
    }
    commits = [{"step": 100, "at": 7000.0}, {"step": 200, "at": 7600.0}, {"step": 300, "at": 8200.0}]
    heartbeat = {"step": 320, "at": 8300.0, "last_save_s": 30.0}

    advice = interval_advice(ledger, commits, heartbeat, gpus_per_node=8, now=8300.0)

    # 512 GPUs, 1 failure in ~1,180 GPU-hours pooled with Llama 3's one in ~50.7K: M ~ 50 h
    assert advice["gpus"] == 512 and advice["failures"] == 1 and advice["prior"] is True
    assert advice["gpu_hours"] == pytest.approx((3600 + 4600) * 512 / 3600, rel=1e-3)
    assert advice["used_s"] == 600.0  # it committed every 10 min
    assert 40 * 60 < advice["best_s"] < 60 * 60 and advice["waste_best"] < advice["waste_used"]
    assert "it saves every 10 min" in advice["summary"]


@pytest.mark.parametrize(
    ("heartbeat", "gpus_per_node"),
    [({"step": 1, "at": 1.0}, 8), ({"step": 1, "at": 1.0, "last_save_s": 30.0}, None)],
    ids=["no save time seen", "GPUs per node unknown"],
)
def test_no_interval_advice_without_a_save_time_or_the_gpus(heartbeat, gpus_per_node):
    ledger = {"attempts": [{"created_at": 0.0, "ended_at": None, "nodes": 2, "kind": None}]}

    assert interval_advice(ledger, [], heartbeat, gpus_per_node, now=10.0) is None
