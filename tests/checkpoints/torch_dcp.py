"""Real PyTorch DCP checkpoints for the tests, written by the installed torch.

``write(directory, ranks=2)`` runs ``torch.distributed.checkpoint`` in a child process (so the test
process never imports torch): one process without a process group for ``ranks=1``, else ``ranks``
forked processes in a gloo group on CPU.  The state dict is a small deterministic model: weights
as DTensors sharded by rows across the ranks, replicated tensors of several dtypes (a channels-last
one, a 0-d one) and plain Python values (DCP's bytes items).  ``checkpoint(ranks, async_save)``
writes one of each kind per test session.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write(directory: Path, *, ranks: int = 2, async_save: bool = False, tensors: int = 2) -> Path:
    """Write a DCP checkpoint of ``tensors`` sharded weights into ``directory`` (created)."""
    command = [sys.executable, "-m", "tests.checkpoints.torch_dcp", str(directory), str(ranks), str(tensors)]
    subprocess.run(command + (["async"] if async_save else []), cwd=ROOT, check=True, timeout=600)
    return directory


@functools.cache
def checkpoint(ranks: int = 2, async_save: bool = False) -> Path:
    """A real checkpoint of this kind, written once per test session."""
    root = Path(tempfile.mkdtemp(prefix="dcp-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return write(root / "checkpoint", ranks=ranks, async_save=async_save)


def upload(client, bucket: str, prefix: str, directory: Path) -> list[str]:
    """Upload every file of ``directory`` under ``prefix``, ``.metadata`` last as DCP writes it."""
    names = sorted(path.name for path in directory.iterdir())
    for name in sorted(names, key=lambda name: name == ".metadata"):
        client.put_object(Bucket=bucket, Key=prefix + name, Body=(directory / name).read_bytes())
    return names


def _state_dict(rank: int, ranks: int, tensors: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    state: dict = {"step": 100, "optimizer.param_groups": [{"lr": 0.01, "betas": (0.9, 0.95)}]}
    if ranks > 1:
        from torch.distributed.tensor import DTensor, Shard, init_device_mesh

        mesh = init_device_mesh("cpu", (ranks,))
    for index in range(tensors):
        full = torch.randn(2 * ranks + 1, 3, generator=generator)  # uneven: the last rank gets fewer rows
        if ranks > 1:
            local = full.tensor_split(ranks)[rank].clone()
            full = DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride()
            )
        state[f"layer{index}.weight"] = full
    state["layer0.bias"] = torch.arange(3, dtype=torch.bfloat16)  # replicated: DCP saves it once
    state["scale"] = torch.tensor(0.5)  # 0-d
    for dtype in (torch.float8_e4m3fn, torch.bool, torch.uint16, torch.complex64, torch.int64):
        state[f"buffers.{str(dtype).removeprefix('torch.')}"] = torch.zeros(2, dtype=dtype)
    state["conv.weight"] = torch.ones(2, 3, 2, 2).to(memory_format=torch.channels_last)
    return state


def _save(rank: int, directory: str, ranks: int, tensors: int, async_save: bool, store: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if ranks > 1 or async_save:  # rendezvous through a file: no port another process could take first
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ranks)
    state = _state_dict(rank, ranks, tensors)
    if async_save:
        dcp.async_save(state, checkpoint_id=directory).result()
    else:
        dcp.save(state, checkpoint_id=directory)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _main(directory: str, ranks: str, tensors: str, *mode: str) -> None:
    import warnings

    import torch.multiprocessing as mp

    warnings.filterwarnings("ignore")  # "assuming the intent is to save in a single process"
    with tempfile.TemporaryDirectory() as scratch:
        args = (directory, int(ranks), int(tensors), mode == ("async",), f"{scratch}/store")
        mp.start_processes(_save, args=args, nprocs=int(ranks), start_method="fork")


if __name__ == "__main__":
    _main(*sys.argv[1:])
