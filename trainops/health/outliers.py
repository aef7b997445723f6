"""Robust outlier scores over a fleet, shared by the GEMM straggler check (``stragglers``) and the
step-time slowdown check (``slowdown``): the modified z-score (Iglewicz & Hoaglin), over the median
absolute deviation, with the mean absolute deviation when the MAD is zero."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

MAD_SCALE = 0.6745  # makes the MAD-based score comparable to a normal z-score
MEAN_AD_SCALE = 1.253314  # Iglewicz & Hoaglin fallback when the MAD is zero


def modified_z_scores(speeds: Mapping[str, float]) -> dict[str, float]:
    """0.6745 * (x - median) / MAD per node (mean absolute deviation fallback when MAD is 0)."""
    if not speeds:
        return {}
    median = statistics.median(speeds.values())
    deviations = [abs(v - median) for v in speeds.values()]
    mad = statistics.median(deviations)
    if mad > 0:
        return {node: MAD_SCALE * (v - median) / mad for node, v in speeds.items()}
    mean_ad = statistics.fmean(deviations)
    if mean_ad == 0:
        return dict.fromkeys(speeds, 0.0)
    return {node: (v - median) / (MEAN_AD_SCALE * mean_ad) for node, v in speeds.items()}
