"""Hugging Face Trainer ``checkpoint-N`` directories.

The Trainer writes no completion marker, so complete means: ``trainer_state.json`` (with
``global_step`` = N) and the weights are present; a sharded index names only shards that exist;
and each ``.safetensors`` file is exactly as long as its header says (header length + tensors).
"""

from __future__ import annotations

import json
import struct

from trainops.checkpoints.formats.base import STRUCTURAL, Checkpoint

TRAINER_STATE = "trainer_state.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SAFETENSORS_HEADER_LIMIT = 32 << 20  # safetensors allows 100 MB; ~300,000 tensors fit in 32 MiB


def looks_like_hf(checkpoint: Checkpoint) -> bool:
    return TRAINER_STATE in checkpoint.files or checkpoint.name.startswith("checkpoint-")


def check(checkpoint: Checkpoint, level: str) -> list[str]:
    files = checkpoint.files
    reasons = []
    if TRAINER_STATE not in files:
        reasons.append(f"{TRAINER_STATE} is missing")
    weights = [name for name in WEIGHT_FILES + INDEX_FILES if name in files]
    if not weights:
        reasons.append(f"no weights: none of {', '.join(WEIGHT_FILES + INDEX_FILES)}")
    reasons += [f"{name} is empty" for name in weights if files[name].size == 0]
    if reasons or level == STRUCTURAL:
        return reasons
    reasons += _check_trainer_state(checkpoint)
    for index_name in (name for name in weights if name in INDEX_FILES):
        reasons += _check_index(checkpoint, index_name)
    for name in sorted(key for key in files if key.endswith(".safetensors")):
        reasons += _check_safetensors(checkpoint, name)
    return reasons


def _check_trainer_state(checkpoint: Checkpoint) -> list[str]:
    try:
        global_step = json.loads(checkpoint.read(TRAINER_STATE))["global_step"]
    except (TypeError, ValueError, KeyError):
        return [f"{TRAINER_STATE} is not valid JSON with a global_step"]
    if checkpoint.step is not None and global_step != checkpoint.step:
        return [f"{TRAINER_STATE} says global_step {global_step}, the directory says {checkpoint.step}"]
    return []


def _check_index(checkpoint: Checkpoint, index_name: str) -> list[str]:
    try:
        shards = set(json.loads(checkpoint.read(index_name))["weight_map"].values())
    except (TypeError, ValueError, KeyError, AttributeError):
        return [f"{index_name} is not valid JSON with a weight_map"]
    return [
        checkpoint.missing(shard, f"named in {index_name}")
        for shard in sorted(shards - set(checkpoint.files))
    ]


def _check_safetensors(checkpoint: Checkpoint, name: str) -> list[str]:
    """A safetensors file is ``u64 header length | JSON header | tensor bytes``; check its length."""
    size = checkpoint.files[name].size
    key = checkpoint.uri.key(name)
    if size < 8:
        return [f"{name} is {size} bytes, shorter than a safetensors header: truncated"]
    (header_length,) = struct.unpack("<Q", checkpoint.store.read_range(checkpoint.uri.bucket, key, 0, 8))
    if not 2 <= header_length <= min(size - 8, SAFETENSORS_HEADER_LIMIT):
        return [f"{name} declares a {header_length}-byte header but is {size} bytes: truncated or corrupt"]
    try:
        header = json.loads(checkpoint.store.read_range(checkpoint.uri.bucket, key, 8, header_length))
        data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return [f"{name} has an unreadable safetensors header"]
    if type(data_end) is not int:
        return [f"{name} has an unreadable safetensors header (data_offsets are not integers)"]
    expected = 8 + header_length + data_end
    if size != expected:
        return [f"{name} is {size} bytes, its header says {expected}: truncated or corrupt"]
    return []
