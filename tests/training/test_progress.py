"""The hang bound: learned from the run's own heartbeats, paused during saves."""

import pytest

from trainops.training.progress import HangPolicy, ProgressTracker

POLICY = HangPolicy(startup_timeout=60, save_timeout=300, safety_factor=5, floor=2)


def beat(t, step, saving=False):
    return {"time": t, "step": step, "saving": saving}


def test_no_deadline_until_pods_run_then_startup_bound_for_a_trainer_that_writes_heartbeats():
    tracker = ProgressTracker(HangPolicy(startup_timeout=60, progress="heartbeat"))
    assert tracker.deadline() is None and tracker.hung(1e9) is None
    tracker.running(100)
    assert tracker.deadline() == 160
    assert tracker.hung(159) is None
    assert "no heartbeat from this attempt" in tracker.hung(160)


def test_a_trainer_without_heartbeat_is_not_hung_at_the_startup_bound_but_judged_by_checkpoints():
    tracker = ProgressTracker(POLICY, checkpoint_step=100)  # resumed from step 100
    tracker.running(0)
    assert not tracker.by_heartbeat
    assert tracker.hung(60) is None and tracker.deadline() == 7200
    assert not tracker.observe_checkpoint(100, now=500)  # the checkpoint it resumed from
    assert tracker.observe_checkpoint(200, now=1000) and tracker.observe_checkpoint(300, now=1600)
    bound, basis = tracker.bound()
    assert bound == 5 * 600 and "between new checkpoints" in basis
    assert tracker.hung(1600 + 2999) is None
    assert "newest checkpoint step 300" in tracker.hung(1600 + 3000)


def test_the_first_heartbeat_switches_to_heartbeat_progress():
    tracker = ProgressTracker(POLICY)
    tracker.running(0)
    assert tracker.deadline() == POLICY.checkpoint_timeout
    assert tracker.observe(beat(30, 5), now=30)
    assert tracker.by_heartbeat and tracker.deadline() == 30 + 60


def test_a_bad_progress_source_names_the_field():
    with pytest.raises(ValueError, match="progress must be one of auto, heartbeat, checkpoints"):
        HangPolicy(progress="logs")


def test_bound_learned_from_heartbeat_intervals():
    tracker = ProgressTracker(POLICY)
    tracker.running(0)
    for i, t in enumerate([10, 11, 12, 13.5]):
        assert tracker.observe(beat(t, (i + 1) * 5), now=t)
    assert tracker.learned_interval() == pytest.approx(1.5)
    bound, basis = tracker.bound()
    assert bound == pytest.approx(7.5) and "1.50s" in basis
    assert tracker.hung(13.5 + 7.4) is None
    assert "step 20" in tracker.hung(13.5 + 7.5)


def test_floor_applies_to_fast_steps():
    tracker = ProgressTracker(POLICY)
    tracker.running(0)
    for t in (1.0, 1.1, 1.2):
        tracker.observe(beat(t, int(t * 10)), now=t)
    assert tracker.bound()[0] == 2


def test_save_pauses_detection_and_does_not_teach_longer_bounds():
    tracker = ProgressTracker(POLICY)
    tracker.running(0)
    for t in (1, 2, 3):
        tracker.observe(beat(t, t), now=t)
    tracker.observe(beat(4, 4, saving=True), now=4)
    assert tracker.bound()[0] == 300 and tracker.hung(4 + 299) is None
    tracker.observe(beat(200, 4), now=200)  # save took 196 s
    assert tracker.learned_interval() == 1
    assert tracker.bound()[0] == 5


def test_stale_heartbeats_of_an_earlier_attempt_do_not_count():
    tracker = ProgressTracker(POLICY, baseline=beat(50, 40))
    tracker.running(60)
    assert not tracker.observe(beat(50, 40), now=61)
    assert tracker.deadline() == 120
    assert tracker.observe(beat(62, 41), now=62)


def test_a_heartbeat_before_the_pods_all_run_is_not_progress_and_starts_no_clock():
    tracker = ProgressTracker(POLICY, baseline=beat(50, 40))
    assert not tracker.observe(beat(55, 45), now=56)  # a pod that is stopping, or one not yet seen running
    assert tracker.deadline() is None and tracker.hung(1e9) is None
    tracker.running(100)
    assert not tracker.observe(beat(55, 45), now=101)  # the same one, read again
    assert tracker.deadline() == 160 and "no heartbeat from this attempt" in tracker.hung(160)
    assert tracker.observe(beat(102, 46), now=102)


def test_fixed_hang_timeout_overrides_learning():
    tracker = ProgressTracker(HangPolicy(hang_timeout=9, floor=1))
    tracker.running(0)
    for t in (1, 2, 3):
        tracker.observe(beat(t, t), now=t)
    assert tracker.bound() == (9, "hang_timeout set by the user")


def test_bad_policy_names_the_field():
    with pytest.raises(ValueError, match="hang_timeout"):
        HangPolicy(hang_timeout=0)
    with pytest.raises(ValueError, match="floor"):
        HangPolicy(floor=-1)
