"""An elastic resume that keeps the global batch: the torch example trainer (FSDP2 over gloo on CPU,
sharded DCP checkpoints in S3) trains on 4 ranks, stops after its checkpoint at step 6, and resumes
on 2 ranks; told the run's original size (``TRAINOPS_ORIGINAL_WORLD_SIZE``), each rank accumulates
two micro-batches per step and takes its slice of the same global batches by sample index, so the
loss curve follows the uninterrupted 4-rank run's within ``TOLERANCE``.  The same resume without the
original size (the global batch halves, as before issue 38) leaves that tolerance: the check can fail."""

from __future__ import annotations

import json
from pathlib import Path

from tests.training.torch_elastic import run

STEPS, CRASH, BATCH, RANKS, FEWER = 12, 6, 16, 4, 2
TOLERANCE = 1e-4  # relative, per step: summation order (2 micro-batches x 2 ranks vs 4 ranks) only


def losses(path: Path) -> dict[int, dict]:
    return {line["step"]: line for line in map(json.loads, path.read_text().splitlines())}


def test_a_resume_on_half_the_ranks_follows_the_uninterrupted_loss_curve(s3, bucket, tmp_path):
    runs = f"s3://{bucket}/runs/"
    args = ["--batch", str(BATCH), "--checkpoint-every", str(CRASH), "--heartbeat-every", "3"]

    def phase(ranks, name, steps, log, **env):
        run_env = {"TRAINOPS_RUN_URI": runs + name + "/", "TRAINOPS_RESUME_FROM": "", **env}
        argv = [*args, "--steps", str(steps), "--loss-log", str(tmp_path / log)]
        return {"ranks": ranks, "env": run_env, "args": argv}

    original = {"TRAINOPS_ORIGINAL_WORLD_SIZE": str(RANKS)}
    crashed = f"{runs}elastic/step-{CRASH}/"
    run(
        [
            phase(RANKS, "whole", STEPS, "whole.jsonl", **original),  # uninterrupted
            phase(RANKS, "elastic", CRASH, "elastic.jsonl", **original),  # to its checkpoint at step 6
            phase(FEWER, "elastic", STEPS, "elastic.jsonl", **original),  # resumes it on 2 ranks
            phase(FEWER, "naive", STEPS, "naive.jsonl", TRAINOPS_RESUME_FROM=crashed),  # no original size
        ],
        s3.env(),
    )
    whole, elastic, naive = (losses(tmp_path / f"{n}.jsonl") for n in ("whole", "elastic", "naive"))

    assert sorted(whole) == sorted(elastic) == list(range(1, STEPS + 1))
    assert [elastic[s]["ranks"] for s in (CRASH, CRASH + 1)] == [RANKS, FEWER]  # it did resume smaller
    for step in range(1, STEPS + 1):
        assert (
            elastic[step]["samples"] == whole[step]["samples"] == step * RANKS * BATCH
        )  # none redone, none skipped
        assert abs(elastic[step]["loss"] - whole[step]["loss"]) <= TOLERANCE * whole[step]["loss"], step
    assert elastic[CRASH]["loss"] == whole[CRASH]["loss"]  # the same ranks up to the crash: bit for bit
    drift = max(
        abs(naive[s]["loss"] - whole[s]["loss"]) / whole[s]["loss"] for s in range(CRASH + 1, STEPS + 1)
    )
    assert drift > 10 * TOLERANCE, drift  # a resume that halves the global batch leaves the curve
