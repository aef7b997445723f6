"""PyTorch Distributed Checkpoint directories (also torchtitan ``step-N`` and the DCP part of others).

DCP writes ``.metadata`` last, after every rank's shards; it references each shard with
``(relative_path, offset, length)``.  Complete means: ``.metadata`` exists, loads as DCP
metadata, every referenced shard exists and is at least ``offset + length`` bytes long, every
chunk of every item has a storage entry and each tensor's chunks add up to its size.
"""

from __future__ import annotations

import pickle

from trainops.checkpoints.formats.base import STRUCTURAL, Checkpoint
from trainops.checkpoints.formats.sandbox import read_requirements

METADATA_FILE = ".metadata"
# ~4 million chunks (one per tensor per rank it is sharded over; 1,000 tensors on 8 ranks is 1.0 MiB,
# 10,000 on 2 ranks 3.6 MiB): e.g. 4,000 tensors with their optimizer state sharded 1,024 ways.
METADATA_LIMIT = 512 << 20
SHARD_SUFFIX = ".distcp"


def looks_like_dcp(files: dict, root: str = "") -> bool:
    return root + METADATA_FILE in files or any(
        key.startswith(root) and key.endswith(SHARD_SUFFIX) for key in files
    )


def check(checkpoint: Checkpoint, level: str, root: str = "") -> list[str]:
    """Reasons the DCP checkpoint under ``root`` (a sub-directory such as ``weights/``) is incomplete."""
    metadata_key = root + METADATA_FILE
    metadata_info = checkpoint.files.get(metadata_key)
    if metadata_info is None:
        return [f"{metadata_key} is missing: DCP writes it last, so the save did not finish"]
    if metadata_info.size == 0:
        return [f"{metadata_key} is empty"]
    if level == STRUCTURAL:
        return []
    try:
        requirements = read_requirements(checkpoint.read(metadata_key, limit=METADATA_LIMIT))
    except (pickle.UnpicklingError, ValueError) as error:
        return [f"{metadata_key} was not loaded: {error}"]
    reasons = []
    for path, min_size in sorted(requirements.min_sizes.items()):
        info = checkpoint.files.get(root + path)
        if info is None:
            reasons.append(checkpoint.missing(root + path, f"referenced by {metadata_key}"))
        elif info.size < min_size:
            reasons.append(
                f"{root + path} is {info.size} bytes but {metadata_key} needs at least {min_size} "
                "(offset+length): truncated"
            )
    if requirements.unstored_items:
        reasons.append(
            f"{metadata_key} lists {len(requirements.unstored_items)} item(s) with no storage entry, "
            f"e.g. {requirements.unstored_items[0]}"
        )
    if requirements.incomplete_tensors:
        reasons.append(
            f"{metadata_key} lists {len(requirements.incomplete_tensors)} tensor(s) whose chunks do not "
            f"cover their size, e.g. {requirements.incomplete_tensors[0]}"
        )
    return reasons
