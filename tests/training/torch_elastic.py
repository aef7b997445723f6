"""Run the torch example trainer (``examples/torch_trainer/train.py``) for the tests, without a cluster.

``python -m tests.training.torch_elastic PHASES.json`` imports torch and the trainer once, then runs
each phase in turn as ``ranks`` forked processes in a gloo group on CPU (rendezvous through a file),
each rank running the trainer's own ``Run`` with the phase's environment (``TRAINOPS_RUN_URI``,
``TRAINOPS_RESUME_FROM``, ``TRAINOPS_ORIGINAL_WORLD_SIZE``...) and arguments.  The S3 variables come
from the caller's environment (the local S3 server).  The test process never imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "examples" / "torch_trainer" / "train.py"


def run(phases: list[dict], env: dict[str, str], timeout: float = 300) -> None:
    """Run ``phases`` (each ``{"ranks": n, "env": {...}, "args": [...]}``) one after the other."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump(phases, spec)
    try:
        command = [sys.executable, "-m", "tests.training.torch_elastic", spec.name]
        subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, check=True, timeout=timeout)
    finally:
        os.unlink(spec.name)


def _rank(rank: int, ranks: int, store: str, argv: list[str]) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    trainer = _trainer()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=ranks, timeout=timedelta(seconds=120)
    )
    try:
        trainer.Run(trainer.parse_args(argv), os.environ["TRAINOPS_RUN_URI"]).train()
    finally:
        dist.destroy_process_group()


_loaded = None


def _trainer():
    global _loaded
    if _loaded is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("torch_trainer", TRAINER)
        _loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_loaded)
    return _loaded


def _main(path: str) -> None:
    import warnings

    import torch.multiprocessing as mp

    warnings.filterwarnings("ignore")
    _trainer()  # import torch and the trainer once, before forking the ranks
    base = dict(os.environ)
    for phase in json.loads(Path(path).read_text()):
        os.environ.clear()
        os.environ.update({**base, **phase.get("env", {})})  # each phase's own, nothing left from the last
        with tempfile.TemporaryDirectory() as scratch:
            args = (phase["ranks"], f"{scratch}/store", phase["args"])
            mp.start_processes(_rank, args=args, nprocs=phase["ranks"], start_method="fork")


if __name__ == "__main__":
    _main(*sys.argv[1:])
