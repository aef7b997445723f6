"""A small trainer for the devcluster's process runtime: simulated steps, real checkpoints in S3.

    python -m trainops_devcluster.demo.trainer --steps 200 --checkpoint-every 20 --step-seconds 0.02

Every rank (``JOB_COMPLETION_INDEX`` of ``TRAINOPS_WORLD_SIZE``) advances the same steps and, at
each checkpoint, writes its shard ``step-<N>/rank-<r>.bin``; rank 0 waits for every shard, then
commits the checkpoint (manifest and ``_COMMITTED``) through the trainops helper and beats the
heartbeat (which also says the step this process started from: ``start_step``).  On start it
resumes from ``TRAINOPS_RESUME_FROM``, else the run's latest verified checkpoint, else step 0 (and a
newer verified checkpoint wins when the pod was restarted in place with the same environment);
``--resume newest-listed`` instead takes the highest ``step-<N>/`` whose commit marker the listing
shows, its content unverified, as a framework on its own does (torchtitan: the largest N whose
``.metadata`` exists; Megatron and DeepSpeed: their tracker file).
Each rank loads its shard of the checkpoint it resumes from: one that is missing or does not parse
fails the process, as ``torch.load`` of a torn file does.  ``--fail-at-step``/``--exit-code`` simulate
a bug in the training code.  A step takes ``--step-seconds`` divided by the speed of the pod's
slowest GPU (``DEVCLUSTER_GPU_SPEED``, which the devcluster sets: 0.5 for a GPU slowed to half).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from trainops.checkpoints.formats.base import step_from_name
from trainops.checkpoints.formats.manifest import COMMITTED_FILE
from trainops.checkpoints.helper import RUN_URI_ENV, commit, heartbeat, resume_from
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri

RESUME_CHOICES = ("trainops", "newest-listed")
GPU_SPEED_ENV = "DEVCLUSTER_GPU_SPEED"  # the devcluster's kubelet: how fast this pod's slowest GPU runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainops_devcluster.demo.trainer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=200, help="train until this step (default 200)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--step-seconds", type=float, default=0.02, help="simulated time per step")
    parser.add_argument("--heartbeat-every", type=int, default=5, help="steps between heartbeats (rank 0)")
    parser.add_argument(
        "--no-heartbeat", action="store_true", help="write no heartbeat at all (a trainer without the helper)"
    )
    parser.add_argument("--save-seconds", type=float, default=0.0, help="simulated extra time a save takes")
    parser.add_argument("--shard-bytes", type=int, default=4096, help="size of each rank's shard")
    parser.add_argument(
        "--shard-wait-seconds", type=float, default=60.0, help="how long rank 0 waits for peers"
    )
    parser.add_argument(
        "--resume",
        choices=RESUME_CHOICES,
        default="trainops",
        help="trainops' resume_from() (default), or the newest step-<N>/ with its commit marker, unverified",
    )
    parser.add_argument("--fail-at-step", type=int, default=None, help="simulate a bug: exit at this step")
    parser.add_argument("--exit-code", type=int, default=1, help="exit code for --fail-at-step")
    args = parser.parse_args(argv)
    for name in ("steps", "checkpoint_every", "heartbeat_every", "shard_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def newest_listed(store: CheckpointStore, run: S3Uri) -> str | None:
    """The highest ``step-<N>/`` under ``run`` that has its commit marker, unverified (``--resume
    newest-listed``)."""
    names, _ = store.list_dir(run)
    for _, name in sorted(
        ((step_from_name(n), n) for n in names if step_from_name(n) is not None), reverse=True
    ):
        checkpoint = run.child(name)
        if store.exists(checkpoint.bucket, checkpoint.key(COMMITTED_FILE)):
            return str(checkpoint)
    return None


class Trainer:
    def __init__(self, args: argparse.Namespace, run_uri: str, rank: int, world: int) -> None:
        self.args, self.rank, self.world = args, rank, world
        self.run = S3Uri.parse(run_uri, field=RUN_URI_ENV)
        self.store = CheckpointStore()
        self.start = 0  # the step this process started from (in each heartbeat: start_step)
        self.speed = float(os.environ.get(GPU_SPEED_ENV) or 1.0)  # a slowed GPU takes longer per step

    def log(self, message: str) -> None:
        print(f"[rank {self.rank}/{self.world}] {message}", flush=True)

    def start_step(self) -> int:
        """The step to start from (its shard loaded): ``--resume``'s checkpoint, or 0."""
        if self.args.resume == "trainops":
            source = resume_from(store=self.store)
        else:
            source = newest_listed(self.store, self.run)
        if not source:
            self.log("fresh start at step 0")
            return 0
        step = self.step_of(source)
        self.load(source, step)
        self.log(f"resumed from {source} (step {step})")
        return step

    def load(self, source: str, step: int) -> None:
        """Read this rank's shard of ``source`` (rank modulo the world it was saved by); exit if it is
        missing, torn or of another step."""
        checkpoint = S3Uri.parse(source, field="TRAINOPS_RESUME_FROM")
        shards = sorted(
            i.key for i in self.store.list(checkpoint) if i.key.rpartition("/")[2].startswith("rank-")
        )
        try:
            first = json.loads(self.store.read(checkpoint.bucket, shards[0], limit=self.args.shard_bytes * 4))
            key = checkpoint.key(f"rank-{self.rank % int(first['world'])}.bin")
            state = json.loads(
                self.store.read(checkpoint.bucket, key, limit=self.args.shard_bytes * 4) or b""
            )
            if len(shards) != int(first["world"]) or state["step"] != step:
                raise ValueError(f"{len(shards)} shard(s) of {first['world']}, step {state['step']}")
        except (IndexError, KeyError, TypeError, ValueError) as error:
            raise SystemExit(f"failed to load checkpoint {source}: {type(error).__name__}: {error}") from None

    @staticmethod
    def step_of(uri: str) -> int:
        step = step_from_name(S3Uri.parse(uri, field="TRAINOPS_RESUME_FROM").name)
        if step is None:
            raise SystemExit(f"cannot resume from {uri}: the name carries no step (expected step-<N>)")
        return step

    def shard(self, step: int) -> bytes:
        state = json.dumps({"step": step, "rank": self.rank, "world": self.world, "loss": 10.0 / (1 + step)})
        return state.encode().ljust(self.args.shard_bytes, b" ")

    def save(self, step: int) -> None:
        checkpoint = self.run.child(f"step-{step}")
        if self.rank == 0:
            self.beat(step, saving=True, phase="checkpoint")
        time.sleep(self.args.save_seconds)
        self.store.put(checkpoint.bucket, checkpoint.key(f"rank-{self.rank}.bin"), self.shard(step))
        if self.rank != 0:
            return
        self.wait_for_shards(checkpoint)
        result = commit(str(checkpoint), step=step, store=self.store)
        self.log(f"checkpoint {checkpoint} committed ({result.files} files, {result.bytes} bytes)")
        self.beat(step)

    def beat(self, step: int, **state) -> None:
        if not self.args.no_heartbeat:
            extra = {"start_step": self.start}
            heartbeat(step, ranks=self.world, run_uri=str(self.run), store=self.store, extra=extra, **state)

    def wait_for_shards(self, checkpoint: S3Uri) -> None:
        wanted = {checkpoint.key(f"rank-{r}.bin") for r in range(self.world)}
        deadline = time.monotonic() + self.args.shard_wait_seconds
        while not wanted <= {info.key for info in self.store.list(checkpoint)}:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"NCCL timeout: ranks missing from the save of {checkpoint} after {self.args.shard_wait_seconds:g}s"
                )
            time.sleep(0.05)

    def train(self) -> int:
        step = self.start = self.start_step()
        while step < self.args.steps:
            step += 1
            time.sleep(self.args.step_seconds / self.speed)
            if self.args.fail_at_step is not None and step == self.args.fail_at_step:
                self.log(f"step {step}: simulated bug, exiting with code {self.args.exit_code}")
                return self.args.exit_code
            if self.rank == 0 and step % self.args.heartbeat_every == 0:
                self.beat(step)
            if step % self.args.checkpoint_every == 0 or step == self.args.steps:
                self.save(step)
        self.log(f"training done at step {step}")
        return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_uri = os.environ.get(RUN_URI_ENV, "").strip()
    if not run_uri:
        print(f"{RUN_URI_ENV} is not set: the run path, e.g. s3://bucket/runs/my-run/", file=sys.stderr)
        return 2
    rank = int(os.environ.get("JOB_COMPLETION_INDEX") or 0)
    world = int(os.environ.get("TRAINOPS_WORLD_SIZE") or 1)
    return Trainer(args, run_uri, rank, world).train()


if __name__ == "__main__":
    sys.exit(main())
