"""When a silent run counts as hung: a bound learned from the run's own heartbeats.

The trainer writes ``heartbeat.json`` (step, time, ``saving``) every few steps.  The watcher
calls the run hung when no new heartbeat arrives within the bound:

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


@dataclass(frozen=True)
class HangPolicy:
    startup_timeout: float = 600.0
    save_timeout: float = 1800.0
    safety_factor: float = 5.0
    floor: float = 30.0
    hang_timeout: float | None = None
    window: int = 50

    def __post_init__(self) -> None:
        for name in ("startup_timeout", "save_timeout", "safety_factor", "floor"):
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

    def __init__(self, policy: HangPolicy, baseline: Mapping | None = None) -> None:
        """``baseline``: the heartbeat already in the bucket when the attempt began (an earlier attempt's);
        only heartbeats written after it count as this attempt's progress."""
        self.policy = policy
        self._baseline_time = float(baseline["time"]) if baseline and "time" in baseline else None
        self._last: Mapping | None = None
        self._last_seen: float | None = None
        self._running_since: float | None = None
        self._intervals: deque[float] = deque(maxlen=policy.window)

    @property
    def last(self) -> Mapping | None:
        """The newest heartbeat of this attempt."""
        return self._last

    def running(self, now: float) -> None:
        """All pods run from ``now``: the startup clock starts (only the first call counts)."""
        if self._running_since is None:
            self._running_since = now

    def observe(self, beat: Mapping | None, now: float) -> bool:
        """Take a heartbeat document as read at ``now``; True when it is new progress."""
        if not beat or "time" not in beat:
            return False
        written = float(beat["time"])
        if self._baseline_time is not None and written <= self._baseline_time:
            return False
        if self._last is not None:
            if written <= float(self._last["time"]):
                return False
            if not self._last.get("saving") and not beat.get("saving"):
                self._intervals.append(written - float(self._last["time"]))
        self._last, self._last_seen = beat, now
        return True

    def learned_interval(self) -> float | None:
        """The longest recent interval between training heartbeats, seconds (None until two arrive)."""
        return max(self._intervals) if self._intervals else None

    def bound(self) -> tuple[float, str]:
        """The silence allowed now, and what it is based on."""
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

    def deadline(self) -> float | None:
        """When the run counts as hung (None while the pods are not all running yet)."""
        since = self._last_seen if self._last is not None else self._running_since
        return None if since is None else since + self.bound()[0]

    def hung(self, now: float) -> str | None:
        """Why the run is hung at ``now``, or None."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return None
        bound, basis = self.bound()
        step = self._last.get("step") if self._last else None
        where = f"last heartbeat at step {step}" if step is not None else "no heartbeat from this attempt"
        return f"no progress for {bound:.1f}s ({where}; bound: {basis})"
