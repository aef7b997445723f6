"""Heartbeat read errors surface: logged, counted, and a run whose heartbeat stays unreadable for
longer than the hang bound ends as ``heartbeat_unreadable``, never as a hang."""

from __future__ import annotations

import logging

from trainops.training.follow import FollowConfig, RunState, Status, read_heartbeat
from trainops.training.progress import HangPolicy

BOUND = 30.0  # one heartbeat so far: max(floor, startup_timeout)


def running_state() -> RunState:
    """An admitted attempt (no Kueue Workload, Job not suspended) whose one pod runs from t=0 and
    whose first heartbeat arrives at t=1."""
    config = FollowConfig(
        "training", "job-1", "s3://b/runs/r/", nodes=1, hang=HangPolicy(startup_timeout=BOUND)
    )
    state = RunState(config, {"metadata": {"name": "job-1"}, "spec": {}}, None, now=0.0)
    pod = {"metadata": {"name": "job-1-0"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    state.apply("pod", "ADDED", pod, 0.0)
    state.heartbeat({"step": 5, "time": 1.0}, 1.0)
    return state


def test_unreadable_heartbeat_fails_the_run_with_that_reason_after_the_hang_bound(caplog):
    state = running_state()
    with caplog.at_level(logging.WARNING, logger="trainops.training.follow"):
        state.heartbeat_failed(ConnectionRefusedError("connect to 127.0.0.1:9 refused"), 2.0)
        state.heartbeat_failed(ConnectionRefusedError("connect to 127.0.0.1:9 refused"), 4.0)

    assert state.failed_reads == 2
    assert [r.getMessage() for r in caplog.records] == [
        "heartbeat read failed (1 so far): ConnectionRefusedError: connect to 127.0.0.1:9 refused",
        "heartbeat read failed (2 so far): ConnectionRefusedError: connect to 127.0.0.1:9 refused",
    ]
    assert state.verdict(1.0 + BOUND + 0.5) is None  # the hang bound passed, but nothing says it hung
    status, message = state.verdict(2.0 + BOUND)
    assert status is Status.HEARTBEAT_UNREADABLE
    assert "heartbeat unreadable for 30.0s" in message and "2 failed reads" in message
    assert "127.0.0.1:9 refused" in message and "AWS connection" in message


def test_a_successful_read_ends_the_outage_and_hang_detection_resumes():
    state = running_state()
    state.heartbeat_failed(TimeoutError("read timed out"), 2.0)
    state.heartbeat({"step": 5, "time": 1.0}, 20.0)  # readable again, no new progress

    assert state.unreadable_since is None and state.failed_reads == 1
    assert state.verdict(1.0 + BOUND - 0.1) is None
    status, message = state.verdict(1.0 + BOUND)
    assert status is Status.HANG and message.startswith("hang: no progress for 30.0s")


def test_unreadable_heartbeat_before_the_pods_run_does_not_end_the_run():
    config = FollowConfig(
        "training", "job-1", "s3://b/runs/r/", nodes=2, hang=HangPolicy(startup_timeout=BOUND)
    )
    state = RunState(config, {"metadata": {"name": "job-1"}, "spec": {"suspend": True}}, None, now=0.0)
    state.heartbeat_failed(OSError("no route to host"), 0.0)

    assert state.verdict(10 * BOUND) is None


def test_an_earlier_attempts_heartbeat_read_again_after_a_requeue_is_not_progress():
    """Preempted before its first heartbeat, the attempt waits in the queue; a heartbeat read that
    fails and recovers returns the earlier attempt's heartbeat again, which must not start a hang clock."""
    config = FollowConfig(
        "training",
        "job-1",
        "s3://b/runs/r/",
        nodes=1,
        hang=HangPolicy(startup_timeout=BOUND),
        admission_timeout=None,
    )
    earlier = {"step": 20, "time": 100.0}
    state = RunState(config, {"metadata": {"name": "job-1"}, "spec": {}}, earlier, now=0.0)
    admitted = {"type": "Admitted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
    state.apply("workload", "ADDED", {"metadata": {"name": "w"}, "status": {"conditions": [admitted]}}, 1.0)
    pod = {"metadata": {"name": "job-1-0"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    state.apply("pod", "ADDED", pod, 2.0)
    preempted = {
        "type": "Evicted",
        "status": "True",
        "reason": "Preempted",
        "lastTransitionTime": "2026-01-01T00:00:03Z",
    }
    requeued = {"metadata": {"name": "w"}, "status": {"conditions": [preempted]}}
    state.apply("workload", "MODIFIED", requeued, 3.0)
    state.heartbeat_failed(TimeoutError("read timed out"), 4.0)
    state.heartbeat(dict(earlier), 6.0)

    assert state.preemptions == ["preempted"]
    assert state.verdict(6.0 + 100 * BOUND) is None  # still queued: nothing to call hung


def test_the_heartbeats_of_preempted_pods_as_they_stop_do_not_time_the_requeued_attempt():
    """Preempted mid-run, the pods keep writing heartbeats while they stop (a fast trainer teaches a
    bound of a few seconds); the requeued attempt then waits for Kueue far longer than that bound, is
    re-admitted and gets the startup bound again. (Seen under load: judged a hang while queued, and a
    resume used for a preemption.)"""
    config = FollowConfig(
        "training",
        "job-1",
        "s3://b/runs/r/",
        nodes=1,
        hang=HangPolicy(startup_timeout=BOUND, floor=2.0),
        admission_timeout=None,
    )
    state = RunState(config, {"metadata": {"name": "job-1"}, "spec": {}}, None, now=0.0)

    def workload(*conditions: dict) -> dict:
        return {"metadata": {"name": "w"}, "status": {"conditions": list(conditions)}}

    def pod(name: str, **metadata) -> dict:
        return {"metadata": {"name": name, **metadata}, "status": {"phase": "Running"}}

    admitted = {"type": "Admitted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
    state.apply("workload", "ADDED", workload(admitted), 1.0)
    state.apply("pod", "ADDED", pod("job-1-0-a"), 2.0)
    for t in (3.0, 3.1, 3.2, 3.3):
        state.heartbeat({"step": int(t * 10), "time": t}, t)
    evicted = {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": "x"}
    state.apply("workload", "MODIFIED", workload(evicted), 4.0)
    stopping = pod("job-1-0-a", deletionTimestamp="2026-01-01T00:00:04Z")
    state.apply("pod", "MODIFIED", stopping, 4.0)
    for t in (4.1, 4.2):  # written by the stopping pod
        state.heartbeat({"step": int(t * 10), "time": t}, t)

    assert state.verdict(600.0) is None  # queued behind the preemptor: nothing to call hung
    state.apply("pod", "DELETED", stopping, 5.0)
    readmitted = {**admitted, "lastTransitionTime": "2026-01-01T00:10:00Z"}
    state.apply("workload", "MODIFIED", workload(readmitted), 600.0)
    state.apply("pod", "ADDED", pod("job-1-0-b"), 601.0)
    assert state.verdict(601.0 + BOUND - 0.1) is None  # starting again, from the checkpoint
    status, message = state.verdict(601.0 + BOUND)
    assert status is Status.HANG and "no heartbeat from this attempt" in message, message


class _OneObjectStore:
    """A store whose heartbeat.json holds ``body``."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self, bucket: str, key: str, *, limit: int) -> bytes:
        return self.body


def test_a_malformed_heartbeat_is_an_unreadable_one_not_a_crash_of_the_follow():
    """Training pods write heartbeat.json: a time that is not a number used to reach the tracker's
    float() and end the follow with a bare ValueError; it now reads as a failed read naming the field."""
    state = running_state()
    for at in (2.0, 4.0):
        try:
            read_heartbeat(_OneObjectStore(b'{"step": 6, "time": "soon"}'), "s3://b/runs/r/")
        except ValueError as error:
            state.heartbeat_failed(error, at)
    status, message = state.verdict(2.0 + BOUND)
    assert status is Status.HEARTBEAT_UNREADABLE
    assert "s3://b/runs/r/heartbeat.json: time must be Unix seconds, got 'soon'" in message
