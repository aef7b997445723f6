"""DeepSpeed checkpoint tags (default ``global_stepN``) and the ``latest`` file beside them.

Rank 0 writes ``latest`` right after its own save, before the barrier, so ``latest`` can name
a tag whose other ranks are still writing.  Complete means: the tag is ``latest`` or older, and
``mp_rank_XX_model_states.pt`` and the ZeRO ``*zero_pp_rank_D_mp_rank_XX_optim_states.pt``
shards are non-empty, with contiguous model-parallel ranks and the same contiguous
data-parallel ranks for each of them.
"""

from __future__ import annotations

import re

from trainops.checkpoints.formats.base import Checkpoint, step_from_name

LATEST = "latest"
_MODEL_STATES = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_ZERO_SHARD = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


def looks_like_deepspeed(checkpoint: Checkpoint) -> bool:
    return any(_MODEL_STATES.match(key) or _ZERO_SHARD.match(key) for key in checkpoint.files) or (
        checkpoint.name.startswith("global_step") and checkpoint.has_sibling(LATEST)
    )


def check(checkpoint: Checkpoint, level: str) -> list[str]:
    return _check_latest(checkpoint) + _check_shards(checkpoint)


def _check_latest(checkpoint: Checkpoint) -> list[str]:
    latest = checkpoint.read_sibling(LATEST)
    if latest is None:
        return [f"no '{LATEST}' file beside the checkpoint: DeepSpeed writes it after saving a tag"]
    tag = latest.decode(errors="replace").strip()
    if tag == checkpoint.name:
        return []
    latest_step = step_from_name(tag)
    if latest_step is None or checkpoint.step is None or checkpoint.step > latest_step:
        return [
            f"'{LATEST}' names {tag!r}; {checkpoint.name} is not that tag or older: the save did not finish"
        ]
    return []


def _check_shards(checkpoint: Checkpoint) -> list[str]:
    files = checkpoint.files
    model_ranks = sorted(int(m.group(1)) for key in files if (m := _MODEL_STATES.match(key)))
    if not model_ranks:
        return ["no mp_rank_XX_model_states.pt: the model states were not saved"]
    reasons = [f"{key} is empty" for key in sorted(files) if files[key].size == 0]
    if model_ranks != list(range(len(model_ranks))):
        reasons.append(
            f"model-parallel ranks {model_ranks} are not contiguous from 0: a rank's save is missing"
        )
    zero: dict[int, list[int]] = {}
    for key in files:
        if match := _ZERO_SHARD.match(key):
            zero.setdefault(int(match.group(2)), []).append(int(match.group(1)))
    if zero:
        world = max(max(ranks) + 1 for ranks in zero.values())
        for mp_rank in model_ranks:
            if sorted(zero.get(mp_rank, [])) != list(range(world)):
                found = sorted(zero.get(mp_rank, []))
                reasons.append(
                    f"ZeRO shards for mp_rank {mp_rank:02d} cover data-parallel ranks {found}, expected 0..{world - 1}"
                )
    return reasons
