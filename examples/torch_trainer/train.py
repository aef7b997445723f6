"""A real multi-node PyTorch trainer for trainops: FSDP2 over gloo on CPU, sharded DCP checkpoints in S3.

Each pod of the trainops Job is one rank: ``torch.distributed`` rendezvouses through the env the Job
sets (``MASTER_ADDR`` = rank 0 behind the Job's headless Service, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``).  A small MLP, sharded across the ranks with ``fully_shard``, learns a fixed
function from a synthetic data set read by global sample index: each step takes the next global
batch of ``--batch`` x the run's original ranks (``TRAINOPS_ORIGINAL_WORLD_SIZE``) samples, each rank
its contiguous slice, so a resumed run retraces the original one, at its size or, after an elastic
resume, on fewer ranks: each then accumulates gradients over more micro-batches (the helper's
``elastic_world()``) and the loss curve is the same.  The checkpoint records the data position as a
global sample offset (``train.samples``).  Every ``--checkpoint-every`` steps each rank saves its shard with
``torch.distributed.checkpoint`` and uploads it to ``$TRAINOPS_RUN_URI/step-<N>/``; rank 0 uploads
the ``.metadata`` last and commits the checkpoint with ``trainops.checkpoints.helper.commit``.
Rank 0 beats the helper's heartbeat.  On start, rank 0 asks ``resume_from()`` where to resume and
tells the others; every rank downloads that checkpoint and loads it with DCP, and rank 0 records
what it loaded (step, SHA-256 of the loaded state) in ``$TRAINOPS_RUN_URI/resumes/``.

    python examples/torch_trainer/train.py --steps 200 --checkpoint-every 20

Needs torch, numpy and boto3, and from trainops only the light ``trainops-core`` helper.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainops.checkpoints.helper import RUN_URI_ENV, commit, elastic_world, heartbeat, resume_from

FEATURES, HIDDEN = 16, 64
DATA_SIZE = 1 << 16  # samples in the synthetic data set; sample i is row i % DATA_SIZE
METADATA_FILE = ".metadata"
RESUMES = "resumes"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="train until this step")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--heartbeat-every", type=int, default=5, help="steps between heartbeats")
    parser.add_argument(
        "--batch",
        type=int,
        default=32,
        help="samples per rank and micro-batch; the global batch is this times the run's original ranks",
    )
    parser.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="extra time per step (a slower model)"
    )
    parser.add_argument("--timeout-seconds", type=float, default=120.0, help="collective timeout")
    parser.add_argument("--loss-log", help="rank 0 appends each step's global loss here (JSON lines)")
    args = parser.parse_args(argv)
    for name in ("steps", "checkpoint_every", "heartbeat_every", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# ---- model and data --------------------------------------------------------------------
def build(world: int, lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model, sharded over every rank (FSDP2), and its optimizer; the same on every run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    )
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def dataset() -> torch.Tensor:
    """The inputs of the synthetic data set, the same in every process (its targets: ``target``)."""
    return torch.randn(DATA_SIZE, FEATURES, generator=torch.Generator().manual_seed(1234))


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x).sum(dim=1, keepdim=True)


def train_step(model, optimizer, x: torch.Tensor, micro_batches: tuple[int, ...], global_batch: int) -> float:
    """One optimizer step over this rank's samples ``x`` of the global batch, in ``micro_batches``
    (gradient accumulation); returns the global batch's mean loss (a collective).

    Each micro-batch's summed loss is divided by the rank's share (``len(x)``): FSDP averages the
    gradients over the ranks, so the step follows the mean over the global batch, whatever the split."""
    share, total, start = len(x), torch.zeros(()), 0
    for index, size in enumerate(micro_batches):
        model.set_requires_gradient_sync(index == len(micro_batches) - 1)  # reduce once, after the last
        xb = x[start : start + size]
        loss = torch.nn.functional.mse_loss(model(xb), target(xb), reduction="sum")
        (loss / share).backward()
        total += loss.detach()
        start += size
    optimizer.step()
    optimizer.zero_grad()
    dist.all_reduce(total)
    return total.item() / global_batch


def state_digest(tree) -> str:
    """SHA-256 over every tensor of a (nested) state dict: path, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for path, tensor in sorted(_tensors(tree, ""), key=lambda item: item[0]):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{path}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _tensors(tree, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    items = (
        tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list | tuple) else ()
    )
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            yield path, value
        else:
            yield from _tensors(value, path + ".")


# ---- S3 (boto3 reads AWS_ENDPOINT_URL_S3 and the usual credentials) --------------------------
def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix if prefix.endswith("/") or not prefix else prefix + "/"


def upload(local: Path, uri: str, names: list[str]) -> None:
    import boto3

    s3, (bucket, prefix) = boto3.client("s3"), split_uri(uri)
    for name in names:
        s3.upload_file(str(local / name), bucket, prefix + name)


def download(uri: str, local: Path) -> None:
    import boto3

    s3, (bucket, prefix) = boto3.client("s3"), split_uri(uri)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) :]
            if "/" not in name:
                s3.download_file(bucket, item["Key"], str(local / name))


def put_json(uri: str, document: dict) -> None:
    import boto3

    bucket, key = split_uri(uri)
    boto3.client("s3").put_object(Bucket=bucket, Key=key.rstrip("/"), Body=json.dumps(document).encode())


# ---- the run ---------------------------------------------------------------------------
class Run:
    def __init__(self, args: argparse.Namespace, run_uri: str) -> None:
        self.args = args
        self.run_uri = run_uri if run_uri.endswith("/") else run_uri + "/"
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # the run's original size (TRAINOPS_ORIGINAL_WORLD_SIZE) against this attempt's
        self.elastic = elastic_world({**os.environ, "RANK": str(self.rank), "WORLD_SIZE": str(self.world)})
        self.global_batch = self.elastic.original_dp_size * args.batch  # kept across an elastic resume
        self.micro_batches = self.elastic.micro_batches(args.batch)  # refuses a batch that does not split
        self.data = dataset()
        self.model, self.optimizer = build(self.world, args.lr)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"rank{self.rank}-"))

    def log(self, message: str) -> None:
        print(f"[rank {self.rank}/{self.world}] {message}", flush=True)

    def state(self, step: int, samples: int) -> dict:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optimizer, "train": {"step": step, "samples": samples}}

    def batch(self, samples: int) -> torch.Tensor:
        """This rank's slice of the global batch that starts at global sample ``samples``."""
        mine = self.elastic.samples(samples, self.global_batch)
        return self.data[torch.arange(mine.start, mine.stop) % DATA_SIZE]

    def full_state_digest(self) -> str | None:
        """The digest of the whole (unsharded) model and optimizer state, on rank 0 (a collective)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model, optimizer = get_state_dict(self.model, self.optimizer, options=options)
        return state_digest({"model": model, "optim": optimizer}) if self.rank == 0 else None

    def save(self, step: int, samples: int) -> None:
        uri = f"{self.run_uri}step-{step}/"
        if self.rank == 0:
            heartbeat(step, ranks=self.world, saving=True, phase="checkpoint", run_uri=self.run_uri)
        local = self.scratch / f"step-{step}"
        dcp.save(self.state(step, samples), checkpoint_id=local)  # this rank's shard: __<rank>_0.distcp
        upload(local, uri, sorted(n for n in os.listdir(local) if n != METADATA_FILE))
        dist.barrier()  # every shard is in the bucket: now the metadata that names them, then commit
        if self.rank == 0:
            upload(local, uri, [METADATA_FILE])
            result = commit(uri, step=step)
            self.log(f"checkpoint {uri} committed ({result.files} files, {result.bytes} bytes)")
            heartbeat(step, ranks=self.world, run_uri=self.run_uri)

    def resume(self) -> tuple[int, int]:
        """Load the checkpoint ``resume_from()`` names (rank 0 decides for all); the step and the global
        sample offset to go on from."""
        choice = [resume_from() if self.rank == 0 else None]
        dist.broadcast_object_list(choice, src=0)
        source = choice[0]
        if not source:
            self.log("fresh start at step 0")
            return 0, 0
        local = self.scratch / "resume"
        local.mkdir()
        download(source, local)
        state = self.state(-1, -1)
        dcp.load(state, checkpoint_id=local)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        step, samples = int(state["train"]["step"]), int(state["train"]["samples"])
        digest = self.full_state_digest()
        if self.rank == 0:
            record = {
                "from": source,
                "step": step,
                "state_sha256": digest,
                "attempt": os.environ.get("TRAINOPS_ATTEMPT"),
            }
            put_json(f"{self.run_uri}{RESUMES}/attempt-{record['attempt']}.json", record)
        self.log(f"resumed from {source} at step {step}, sample {samples} (state sha256 {digest})")
        return step, samples

    def train(self) -> None:
        step, samples = self.resume()
        if self.elastic.resized:
            self.log(
                f"elastic: {self.world} of the run's {self.elastic.original_world_size} ranks keep its global batch "
                f"of {self.global_batch} with micro-batches {list(self.micro_batches)} per rank; each holds "
                f"{self.elastic.shard_growth:g}x its sharded state"
            )
        while step < self.args.steps:
            step += 1
            x = self.batch(samples)
            loss = train_step(self.model, self.optimizer, x, self.micro_batches, self.global_batch)
            samples += self.global_batch
            if self.rank == 0 and self.args.loss_log:
                with open(self.args.loss_log, "a") as log:
                    print(
                        json.dumps({"step": step, "loss": loss, "ranks": self.world, "samples": samples}),
                        file=log,
                    )
            time.sleep(self.args.step_seconds)
            if self.rank == 0 and step % self.args.heartbeat_every == 0:
                heartbeat(step, ranks=self.world, run_uri=self.run_uri, extra={"loss": loss})
            if step % self.args.checkpoint_every == 0 or step == self.args.steps:
                self.save(step, samples)
        self.log(f"training done at step {step}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_uri = os.environ.get(RUN_URI_ENV, "").strip()
    if not run_uri.startswith("s3://"):
        print(f"{RUN_URI_ENV} must be the run path, e.g. s3://bucket/runs/my-run/", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one CPU core per rank
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_seconds))
    try:
        Run(args, run_uri).train()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
