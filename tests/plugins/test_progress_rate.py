"""The run view's rate counts only the current attempt's progress, also when the attempt was resumed
within the second of the last commits before the crash (Job creation times have whole seconds)."""

from __future__ import annotations

from trainops.plugins.progress import heartbeat_rate


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
