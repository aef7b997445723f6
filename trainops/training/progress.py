"""When a silent run counts as hung: a bound learned from the run's own progress.

Which progress applies (``HangPolicy.progress``; ``auto`` by default):

- **heartbeat**, when the trainer writes one: the helper (``trainops.checkpoints.helper.heartbeat``)
  writes ``heartbeat.json`` (step, time, ``saving``) every few steps. ``auto`` switches to it as
  soon as one is seen, from this attempt or an earlier one of the run.
- **checkpoints** otherwise: a trainer without the helper is judged by the new checkpoint
  directories (``step-N`` and the other recognised names) under its run path. Before this attempt
  writes two new checkpoints the silence allowed is ``checkpoint_timeout`` (default 2 h: set it
  above the run's checkpoint interval plus its start-up); then ``max(floor, safety_factor *
  longest interval between new checkpoints)``, or ``hang_timeout`` when the user gives one.

With heartbeats the watcher calls the run hung when no new heartbeat arrives within the bound:

- before the first heartbeat of this attempt: ``startup_timeout`` after the pods run;
- while the last heartbeat says a checkpoint is being saved: ``save_timeout`` (hang detection
  is paused for the save, but not forever);
- otherwise ``max(floor, safety_factor * longest recent interval between heartbeats)``, or a
  fixed ``hang_timeout`` when the user gives one.  Intervals that contain a save are left out,
  so a slow save does not teach the watcher to wait longer between training heartbeats.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

PROGRESS = ("auto", "heartbeat", "checkpoints")


@dataclass(frozen=True)
class HangPolicy:
    startup_timeout: float = 600.0
    save_timeout: float = 1800.0
    safety_factor: float = 5.0
    floor: float = 30.0
    hang_timeout: float | None = None
    window: int = 50
    checkpoint_timeout: float = 7200.0
    progress: str = "auto"

    def __post_init__(self) -> None:
        if self.progress not in PROGRESS:
            raise ValueError(f"progress must be one of {', '.join(PROGRESS)}, got {self.progress!r}")
        for name in ("startup_timeout", "save_timeout", "safety_factor", "floor", "checkpoint_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise ValueError(
                f"hang_timeout must be positive seconds or None (learned), got {self.hang_timeout!r}"
            )

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class ProgressTracker:
    """Follows one attempt's heartbeats.  Times passed in are the watcher's clock (monotonic or wall)."""

    def __init__(
        self, policy: HangPolicy, baseline: Mapping | None = None, checkpoint_step: int | None = None
    ) -> None:
        """``baseline``: the heartbeat already in the bucket when the attempt began (an earlier attempt's);
        only heartbeats written after it count as this attempt's progress. ``checkpoint_step``: the
        newest checkpoint step then (None: none); only newer checkpoints count."""
        self.policy = policy
        self._baseline = baseline if baseline and "time" in baseline else None
        self._baseline_time = float(baseline["time"]) if self._baseline else None
        self.checkpoint_step = checkpoint_step
        self._checkpoint_seen: float | None = None
        self._checkpoint_intervals: deque[float] = deque(maxlen=policy.window)
        self._last: Mapping | None = None
        self._last_seen: float | None = None
        self._running_since: float | None = None
        self._intervals: deque[float] = deque(maxlen=policy.window)

    @property
    def last(self) -> Mapping | None:
        """The newest heartbeat of this attempt."""
        return self._last

    def requeued(self) -> ProgressTracker:
        """A tracker for this attempt once Kueue has requeued it: its pods start again, and no
        heartbeat seen so far (this attempt's or the baseline) counts as progress after that."""
        return ProgressTracker(self.policy, self._last or self._baseline, self.checkpoint_step)

    def running(self, now: float) -> None:
        """All pods run from ``now``: the startup clock starts (only the first call counts)."""
        if self._running_since is None:
            self._running_since = now

    def observe(self, beat: Mapping | None, now: float) -> bool:
        """Take a heartbeat document as read at ``now``; True when it is new progress.  Until all pods
        run, a new heartbeat is not this admission's progress (after a requeue it is the evicted pods'
        last words as they stop): it only moves the baseline."""
        if not beat or "time" not in beat:
            return False
        written = float(beat["time"])
        if self._baseline_time is not None and written <= self._baseline_time:
            return False
        if self._running_since is None:
            self._baseline, self._baseline_time = beat, written
            return False
        if self._last is not None:
            if written <= float(self._last["time"]):
                return False
            if not self._last.get("saving") and not beat.get("saving"):
                self._intervals.append(written - float(self._last["time"]))
        self._last, self._last_seen = beat, now
        return True

    @property
    def by_heartbeat(self) -> bool:
        """Whether progress is the heartbeat (the trainer writes one) rather than new checkpoints."""
        if self.policy.progress != "auto":
            return self.policy.progress == "heartbeat"
        return self._baseline_time is not None or self._last is not None

    def observe_checkpoint(self, step: int | None, now: float) -> bool:
        """Take the newest checkpoint step under the run path as read at ``now``; True when it is new."""
        if step is None or (self.checkpoint_step is not None and step <= self.checkpoint_step):
            return False
        if self._checkpoint_seen is not None:
            self._checkpoint_intervals.append(now - self._checkpoint_seen)
        self.checkpoint_step, self._checkpoint_seen = step, now
        return True

    def learned_interval(self) -> float | None:
        """The longest recent interval between training heartbeats, seconds (None until two arrive)."""
        return max(self._intervals) if self._intervals else None

    def bound(self) -> tuple[float, str]:
        """The silence allowed now, and what it is based on."""
        if not self.by_heartbeat:
            return self._checkpoint_bound()
        if self._last is None:
            return self.policy.startup_timeout, "startup (no heartbeat yet from this attempt)"
        if self._last.get("saving"):
            return self.policy.save_timeout, f"checkpoint save in progress at step {self._last.get('step')}"
        if self.policy.hang_timeout is not None:
            return self.policy.hang_timeout, "hang_timeout set by the user"
        learned = self.learned_interval()
        if learned is None:
            return max(self.policy.floor, self.policy.startup_timeout), "one heartbeat so far"
        bound = max(self.policy.floor, self.policy.safety_factor * learned)
        return (
            bound,
            f"{self.policy.safety_factor:g} x longest heartbeat interval {learned:.2f}s (floor {self.policy.floor:g}s)",
        )

    def _checkpoint_bound(self) -> tuple[float, str]:
        if self.policy.hang_timeout is not None:
            return self.policy.hang_timeout, "hang_timeout set by the user (progress: new checkpoints)"
        if not self._checkpoint_intervals:
            return self.policy.checkpoint_timeout, (
                "no heartbeat from this trainer: progress is read from new checkpoints "
                f"(checkpoint_timeout {self.policy.checkpoint_timeout:g}s until two arrive)"
            )
        learned = max(self._checkpoint_intervals)
        bound = max(self.policy.floor, self.policy.safety_factor * learned)
        return bound, (
            f"{self.policy.safety_factor:g} x longest interval between new checkpoints {learned:.2f}s "
            f"(no heartbeat from this trainer; floor {self.policy.floor:g}s)"
        )

    def deadline(self) -> float | None:
        """When the run counts as hung (None while the pods are not all running yet)."""
        if self._running_since is None:
            return None
        if self.by_heartbeat:
            since = self._last_seen if self._last is not None else self._running_since
        else:
            since = self._checkpoint_seen or self._running_since
        return None if since is None else since + self.bound()[0]

    def hung(self, now: float) -> str | None:
        """Why the run is hung at ``now``, or None."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return None
        bound, basis = self.bound()
        if not self.by_heartbeat:
            where = (
                f"newest checkpoint step {self.checkpoint_step}"
                if self._checkpoint_seen is not None
                else "no new checkpoint from this attempt"
            )
            return f"no progress for {bound:.1f}s ({where}; bound: {basis})"
        step = self._last.get("step") if self._last else None
        where = f"last heartbeat at step {step}" if step is not None else "no heartbeat from this attempt"
        return f"no progress for {bound:.1f}s ({where}; bound: {basis})"
