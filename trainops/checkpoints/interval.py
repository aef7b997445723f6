"""How often to checkpoint: the interval that loses the least GPU time, from the save time and the failure rate.

Every save blocks training for ``save_s``; every failure loses on average half an interval of steps
(plus detection and restart, which the interval does not change).  Young (1974) and Daly (2006) give
the interval between saves that minimises the sum, from the save time and the run's mean time between
failures ``M``: ``sqrt(2·C·M)``, refined by Daly to
``sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + (δ/2M)/9] − δ`` for ``δ < 2M`` (else ``M``).

The run's ``M`` is the fleet's failure rate per GPU-hour times its GPUs.  A young fleet has seen too few
failures to know its rate, so the observed failures are pooled with Llama 3's (one failure per ~50.7K
GPU-hours: 419 unexpected interruptions on 16,384 H100s in 54 days, arXiv:2407.21783 §3.3.4) counted as
one failure seen over that many GPU-hours; as the fleet's own GPU-hours grow they outweigh it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LLAMA3_GPU_HOURS_PER_FAILURE = 16_384 * 54 * 24 / 419  # ~50.7K GPU-hours


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Seconds between saves that minimise lost time (Daly 2006's higher-order Young optimum)."""
    if save_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"save_s and mtbf_s must be positive seconds, got {save_s!r} and {mtbf_s!r}")
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_s


def waste(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """The share of time a run loses to saving every ``interval_s`` and redoing half of it per failure."""
    return save_s / interval_s + interval_s / 2 / mtbf_s


@dataclass(frozen=True)
class IntervalAdvice:
    """``best_s``: the interval that minimises lost GPU time; ``used_s``: the run's (None: unknown); the
    waste at each; and what they rest on: the save time, the run's GPUs, the failures and GPU-hours
    observed, and the resulting mean time between failures of the run."""

    best_s: float
    used_s: float | None
    waste_best: float
    waste_used: float | None
    save_s: float
    gpus: int
    failures: int
    gpu_hours: float
    mtbf_s: float
    prior: bool

    def to_dict(self) -> dict:
        return {
            "best_s": round(self.best_s, 3),
            "used_s": None if self.used_s is None else round(self.used_s, 3),
            "waste_best": round(self.waste_best, 4),
            "waste_used": None if self.waste_used is None else round(self.waste_used, 4),
            "save_s": round(self.save_s, 3),
            "gpus": self.gpus,
            "failures": self.failures,
            "gpu_hours": round(self.gpu_hours, 3),
            "mtbf_s": round(self.mtbf_s, 1),
            "prior": self.prior,
            "summary": self.summary(),
        }

    def summary(self) -> str:
        seen = f"{self.failures} failure(s) in {self.gpu_hours:,.1f} GPU-hours"
        basis = f"{seen} pooled with Llama 3's rate" if self.prior else seen
        used = (
            f"; it saves every {duration(self.used_s)} ({self.waste_used:.1%} lost)"
            if self.used_s is not None and self.waste_used is not None
            else ""
        )
        return (
            f"save every {duration(self.best_s)} ({self.waste_best:.1%} lost to saves and redone steps): "
            f"a save takes {duration(self.save_s)}, one failure every {duration(self.mtbf_s)} on "
            f"{self.gpus} GPUs ({basis}){used}"
        )


def advise(
    *,
    save_s: float,
    gpus: int,
    failures: int,
    gpu_hours: float,
    used_s: float | None = None,
    prior: bool = True,
) -> IntervalAdvice:
    """The best interval for a run on ``gpus`` GPUs whose saves take ``save_s``, given ``failures`` seen in
    ``gpu_hours`` (pooled with Llama 3's rate when ``prior``); ``used_s``: the interval the run uses."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus!r}")
    if failures < 0 or gpu_hours < 0:
        raise ValueError(f"failures and gpu_hours must be >= 0, got {failures!r} and {gpu_hours!r}")
    seen_failures, seen_hours = (
        failures + (1 if prior else 0),
        gpu_hours + (LLAMA3_GPU_HOURS_PER_FAILURE if prior else 0),
    )
    if seen_failures == 0:
        raise ValueError("no failure observed and no prior: the failure rate is unknown")
    mtbf_s = seen_hours / seen_failures / gpus * 3600
    best = daly_interval(save_s, mtbf_s)
    return IntervalAdvice(
        best_s=best,
        used_s=used_s,
        waste_best=waste(best, save_s, mtbf_s),
        waste_used=None if not used_s else waste(used_s, save_s, mtbf_s),
        save_s=save_s,
        gpus=gpus,
        failures=failures,
        gpu_hours=gpu_hours,
        mtbf_s=mtbf_s,
        prior=prior,
    )


def duration(seconds: float) -> str:
    """``42 ms``, ``3.5 s``, ``27 min``, ``12.4 h``, ``33 d``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"
