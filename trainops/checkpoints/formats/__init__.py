"""Checkpoint formats: recognise a directory's layout and list the reasons it is not complete.

A checkpoint committed with the trainops manifest is checked against it *and* against its
framework layout when one is recognised (``trainops+torchtitan``): the manifest proves the files
are the ones committed, the layout proves the save itself had finished.
"""

from __future__ import annotations

from collections.abc import Callable

from trainops.checkpoints.formats import dcp, deepspeed, hf, manifest, megatron, nemo
from trainops.checkpoints.formats.base import Checkpoint

Detector = Callable[[Checkpoint], bool]
Checker = Callable[[Checkpoint, str], list[str]]

FRAMEWORKS: list[tuple[str, Detector, Checker]] = [
    ("nemo", nemo.looks_like_nemo, nemo.check),
    ("megatron", megatron.looks_like_megatron, megatron.check),
    ("deepspeed", deepspeed.looks_like_deepspeed, deepspeed.check),
    ("hf", hf.looks_like_hf, hf.check),
    ("torchtitan", lambda c: c.name.startswith("step-") and dcp.looks_like_dcp(c.files), dcp.check),
    ("dcp", lambda c: dcp.looks_like_dcp(c.files), dcp.check),
]
# What the commonest layouts read first (the trainops commit and DCP's .metadata): verify reads them together.
PREFETCH = {
    manifest.MANIFEST_FILE: manifest.MANIFEST_READ_LIMIT,
    manifest.COMMITTED_FILE: manifest.COMMITTED_READ_LIMIT,
    dcp.METADATA_FILE: dcp.METADATA_LIMIT,
}
UNRECOGNISED = (
    "no recognised checkpoint layout (trainops manifest, DCP .metadata, Hugging Face trainer_state.json, "
    "Megatron iter_N, DeepSpeed tag, NeMo)"
)


def check(checkpoint: Checkpoint, level: str) -> tuple[str, list[str]]:
    """The format name and the reasons the checkpoint is not complete (empty when it is)."""
    reasons = nemo.marker_reasons(checkpoint)
    framework = next(((name, checker) for name, detect, checker in FRAMEWORKS if detect(checkpoint)), None)
    if manifest.looks_committed(checkpoint.files):
        reasons += manifest.check(checkpoint, level)
        if framework is None:
            return "trainops", reasons
        return f"trainops+{framework[0]}", reasons + framework[1](checkpoint, level)
    if framework is None:
        return "unknown", reasons + [UNRECOGNISED]
    return framework[0], reasons + framework[1](checkpoint, level)
