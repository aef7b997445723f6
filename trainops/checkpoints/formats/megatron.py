"""Megatron-LM ``iter_NNNNNNN`` directories and their tracker ``latest_checkpointed_iteration.txt``.

Rank 0 writes the tracker after the save barrier, so an iteration newer than the tracker is
unfinished.  The tracker alone proves nothing (NVIDIA/Megatron-LM#5281: an interrupted in-place
re-save left it pointing at a partial directory), so the content is checked too:
``torch_dist`` checkpoints as DCP plus ``metadata.json`` and ``common.pt``; legacy ones as
``mp_rank_TT[_PPP[_EEE]]/model_optim_rng.pt``, non-empty, with contiguous tensor/pipeline ranks.
"""

from __future__ import annotations

import math
import re

from trainops.checkpoints.formats import dcp
from trainops.checkpoints.formats.base import Checkpoint

TRACKER = "latest_checkpointed_iteration.txt"
TORCH_DIST_FILES = ("metadata.json", "common.pt")
MODEL_FILE = "model_optim_rng.pt"
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?/")


def looks_like_megatron(checkpoint: Checkpoint) -> bool:
    return (
        re.fullmatch(r"iter_\d+|release", checkpoint.name) is not None
        or "metadata.json" in checkpoint.files
        or any(_RANK_DIR.match(key) for key in checkpoint.files)
    )


def check(checkpoint: Checkpoint, level: str) -> list[str]:
    reasons = _check_tracker(checkpoint)
    if ".metadata" in checkpoint.files or "metadata.json" in checkpoint.files:
        reasons += [
            f"{name} is missing (torch_dist format)"
            for name in TORCH_DIST_FILES
            if name not in checkpoint.files
        ]
        return reasons + dcp.check(checkpoint, level)
    return reasons + _check_legacy(checkpoint)


def _check_tracker(checkpoint: Checkpoint) -> list[str]:
    tracker = checkpoint.read_sibling(TRACKER)
    if tracker is None:
        return [f"no {TRACKER} beside the checkpoint: Megatron writes it once every rank has saved"]
    value = tracker.decode(errors="replace").strip()
    if value == "release":
        return [] if checkpoint.name == "release" else [f"{TRACKER} says 'release', not an iteration"]
    if not value.isdigit():
        return [f"{TRACKER} holds {value!r}, not an iteration number"]
    if checkpoint.step is None or checkpoint.step > int(value):
        return [f"iteration {checkpoint.step} is newer than {TRACKER} ({value}): the save did not finish"]
    return []


def _check_legacy(checkpoint: Checkpoint) -> list[str]:
    ranks: dict[tuple[int, int, int], str] = {}
    for key in checkpoint.files:
        if match := _RANK_DIR.match(key):
            tp, pp, ep = (int(group) if group else 0 for group in match.groups())
            ranks[(tp, pp, ep)] = match.group(0)
    if not ranks:
        return ["no mp_rank_* directories and no torch_dist files: not a complete Megatron checkpoint"]
    reasons = []
    for rank_dir in sorted(ranks.values()):
        info = checkpoint.files.get(rank_dir + MODEL_FILE)
        if info is None:
            reasons.append(checkpoint.missing(rank_dir + MODEL_FILE, "every rank directory holds one"))
        elif info.size == 0:
            reasons.append(f"{rank_dir + MODEL_FILE} is empty")
    axes = [sorted({rank[axis] for rank in ranks}) for axis in range(3)]
    for values, name in zip(axes, ("tensor", "pipeline", "expert"), strict=True):
        if values != list(range(len(values))):
            reasons.append(
                f"{name}-parallel ranks {values} are not contiguous from 0: a rank's save is missing"
            )
    if len(ranks) != math.prod(len(values) for values in axes):
        reasons.append(f"only {len(ranks)} of the {math.prod(len(v) for v in axes)} rank directories exist")
    return reasons
