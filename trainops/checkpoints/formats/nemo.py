"""NeMo (Lightning) checkpoints: ``<name>-unfinished`` beside a checkpoint marks a save in progress.

NeMo creates the marker before saving and removes it after, and its resume skips marked
checkpoints; a stale marker (the save crashed) therefore always means incomplete.  The content
of a NeMo distributed checkpoint is a DCP directory, at the top or under ``weights/``.
"""

from __future__ import annotations

from trainops.checkpoints.formats import dcp
from trainops.checkpoints.formats.base import Checkpoint

UNFINISHED_SUFFIX = "-unfinished"


def looks_like_nemo(checkpoint: Checkpoint) -> bool:
    return "step=" in checkpoint.name


def marker_reasons(checkpoint: Checkpoint) -> list[str]:
    """Applies to every format: a NeMo marker next to any checkpoint means its save did not finish."""
    marker = checkpoint.name + UNFINISHED_SUFFIX
    if checkpoint.has_sibling(marker):
        return [f"{marker} exists beside the checkpoint: its save started and did not finish"]
    return []


def check(checkpoint: Checkpoint, level: str) -> list[str]:
    root = "weights/" if dcp.looks_like_dcp(checkpoint.files, "weights/") else ""
    return dcp.check(checkpoint, level, root)
