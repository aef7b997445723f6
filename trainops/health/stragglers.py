"""Relative speed against the candidate fleet, straggler detection and speed tiers (reference §6).

A node's speed is the slowest of its GPUs (a synchronous step waits for the slowest rank).
A straggler is both a statistical outlier (modified z-score over the MAD below ``z_threshold``)
and materially slow (more than ``min_pct_below`` percent below the median): a tight fleet must not
lose a node for being 1% slower. Speeds are compared within one GPU family (``families``: same-SKU
variation is what the statistics describe; an L4 is not a slow H100). Healthy nodes are then
grouped so that a run gets nodes within ``tier_width_pct`` of each other, the fastest such group
that is large enough.

A node whose speed is unknown (its probe has not timed a GEMM yet) is never left out for that
alone: the nodes of unknown speed form a group of their own, reported as such, chosen when no
measured tier is large enough; ``unknown_speed="exclude"`` opts into leaving them out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainops.health.outliers import modified_z_scores
from trainops.health.report import HealthReport, Signal, get_signal

if TYPE_CHECKING:
    from trainops.health.policy import NodeVerdict

USABLE = ("ok", "warn")
UNKNOWN_SPEED = ("group", "exclude")


def node_speed(report: HealthReport, signal: str = "gemm_tflops") -> Signal:
    """The slowest GPU's measured speed; unknown when any GPU's speed is unknown. A speed that is not
    a number (the node wrote it) is a ValueError naming the GPU."""
    speeds = [(key, get_signal(gpu, signal)) for key, gpu in sorted(report.gpus.items())]
    if not speeds:
        return Signal.unknown("no GPUs in report")
    unknown = [s for _, s in speeds if not s.known]
    if unknown:
        return unknown[0]
    for key, speed in speeds:
        if isinstance(speed.value, bool) or not isinstance(speed.value, int | float):
            raise ValueError(f"gpu {key} {signal}={repr(speed.value)[:80]} is not a number")
    return Signal(min(s.value for _, s in speeds))


def percent_below_median(speeds: Mapping[str, float]) -> dict[str, float]:
    if not speeds:
        return {}
    median = statistics.median(speeds.values())
    return {node: 100.0 * (median - v) / median for node, v in speeds.items()}


@dataclass
class Selection:
    """The nodes given to a run (fastest first) and why every other candidate was left out."""

    node_names: list[str]
    enough: bool
    tier: tuple[float, float] | None  # (slowest, fastest) speed of the chosen tier; None if untiered
    excluded: dict[str, str] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    group: str = "untiered"  # "tier" (measured speeds), "speed unknown", or "untiered"
    speed_unknown: list[str] = field(default_factory=list)  # usable nodes without a measured speed


def choose_nodes(
    verdicts: Iterable[NodeVerdict],
    speeds: Mapping[str, float | None],
    min_nodes: int,
    *,
    z_threshold: float = -2.0,
    min_pct_below: float = 3.5,
    tier_width_pct: float = 3.5,
    unknown_speed: str = "group",
    families: Mapping[str, str] | None = None,
) -> Selection:
    """Usable nodes (verdict ok/warn), stragglers removed, from the first group of ``min_nodes``.

    ``speeds`` may be empty (speed tiers off): then every usable node is chosen, untiered.
    ``families``: node -> GPU family; stragglers are judged within a family (default: one family).
    Otherwise the groups, in order of preference: the fastest measured tier large enough, then
    the nodes of unknown speed, then every non-straggler untiered. With ``unknown_speed="exclude"``
    a node of unknown speed is left out instead.
    """
    if min_nodes < 1:
        raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
    if unknown_speed not in UNKNOWN_SPEED:
        raise ValueError(f"unknown_speed must be one of {', '.join(UNKNOWN_SPEED)}, got {unknown_speed!r}")
    excluded: dict[str, str] = {}
    usable: list[str] = []
    for verdict in verdicts:
        if verdict.verdict in USABLE:
            usable.append(verdict.name)
        else:
            excluded[verdict.name] = f"{verdict.verdict}: " + "; ".join(verdict.reasons)
    if not speeds:
        chosen = sorted(usable)
        return Selection(chosen, len(chosen) >= min_nodes, None, excluded)

    known = {node: float(speeds[node]) for node in usable if speeds.get(node) is not None}
    unknown = sorted(node for node in usable if node not in known)
    if unknown_speed == "exclude":
        excluded.update(dict.fromkeys(unknown, "exclude: speed unknown (unknown_speed='exclude')"))
        unknown = []
    by_family: dict[str, dict[str, float]] = {}
    for node, speed in known.items():
        by_family.setdefault((families or {}).get(node, ""), {})[node] = speed
    scores: dict[str, dict[str, float]] = {}
    for family, members in sorted(by_family.items()):
        z_scores, below = modified_z_scores(members), percent_below_median(members)
        scores.update(
            {
                n: {"speed": members[n], "modified_z": z_scores[n], "pct_below_median": below[n]}
                for n in members
            }
        )
        median = f"the {family} median" if family else "fleet median"
        for node in members:
            if z_scores[node] < z_threshold and below[node] > min_pct_below:
                excluded[node] = (
                    f"exclude: straggler, {below[node]:.1f}% below {median} (z={z_scores[node]:.1f})"
                )
                del known[node]

    ranked = sorted(known, key=lambda n: (-known[n], n))
    for start, fastest in enumerate(ranked):
        floor = known[fastest] * (1 - tier_width_pct / 100.0)
        tier = [n for n in ranked[start:] if known[n] >= floor]
        if len(tier) >= min_nodes:
            for node in ranked:
                if node not in tier:
                    excluded[node] = f"exclude: speed {known[node]:.1f} outside the chosen tier"
            for node in unknown:
                excluded[node] = (
                    "exclude: speed unknown, grouped apart from the chosen tier of measured speed"
                )
            tiered = (known[tier[-1]], known[fastest])
            return Selection(tier, True, tiered, excluded, scores, "tier", unknown)
    if len(unknown) >= min_nodes:
        for node in ranked:
            excluded[node] = (
                f"exclude: no tier of {min_nodes} measured node(s); the nodes of unknown speed were chosen"
            )
        return Selection(unknown, True, None, excluded, scores, "speed unknown", unknown)
    chosen = ranked + unknown
    return Selection(chosen, len(chosen) >= min_nodes, None, excluded, scores, "untiered", unknown)
