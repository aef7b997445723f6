"""The end checks of ``--trainer torch``: what a resume loaded is bit for bit what was saved, the step
count goes on from the checkpoint, and every checkpoint holds one DCP shard per rank.

The trainer (``examples/torch_trainer/train.py``) records each resume in ``<run>/resumes/``: the
checkpoint, its step and the SHA-256 of the state it loaded.  Here the same checkpoint is read
back from the bucket independently (DCP -> one ``torch.save`` file, no process group) and hashed
with the trainer's own ``state_digest``.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path
from types import ModuleType

from trainops_devcluster.demo.timeline import Timeline


def load_trainer(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_trainer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved_state_digest(trainer: ModuleType, checkpoint_uri: str) -> tuple[str, int]:
    """The digest of the model and optimizer state in a checkpoint, and the step it records."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="demo-torch-") as tmp:
        local = Path(tmp) / "dcp"
        local.mkdir()
        trainer.download(checkpoint_uri, local)
        dcp_to_torch_save(local, Path(tmp) / "full.pt")
        state = torch.load(Path(tmp) / "full.pt", weights_only=False)
    return trainer.state_digest({"model": state["model"], "optim": state["optim"]}), int(
        state["train"]["step"]
    )


def torch_checks(
    timeline: Timeline, run_uri: str, trainer_path: Path, *, steps: int, every: int, ranks: int
) -> bool:
    import boto3

    trainer = load_trainer(trainer_path)
    bucket, prefix = trainer.split_uri(run_uri)
    s3 = boto3.client("s3")
    keys = {
        item["Key"][len(prefix) :]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    }
    records = [
        json.loads(s3.get_object(Bucket=bucket, Key=prefix + key)["Body"].read())
        for key in sorted(keys)
        if key.startswith(f"{trainer.RESUMES}/")
    ]
    committed = sorted(
        int(k.split("/")[0][5:]) for k in keys if k.startswith("step-") and k.endswith("/_COMMITTED")
    )
    shards = {f"__{rank}_0.distcp" for rank in range(ranks)} | {trainer.METADATA_FILE}
    unsharded = [step for step in committed if not {f"step-{step}/{name}" for name in shards} <= keys]
    checks = [
        (
            f"every committed checkpoint holds a DCP shard of each of the {ranks} ranks and .metadata",
            bool(committed) and not unsharded,
            f"{len(committed)} checkpoints; missing shards in: {unsharded or 'none'}",
        ),
        ("the run resumed (a resume recorded by the trainer)", bool(records), f"{len(records)} resume(s)"),
    ]
    for record in records:
        saved, saved_step = saved_state_digest(trainer, record["from"])
        checks += [
            (
                f"attempt {record['attempt']}: the state loaded from {record['from']} equals the saved state bit for bit",
                saved == record["state_sha256"],
                f"sha256 loaded {record['state_sha256'][:16]}..., saved {saved[:16]}...",
            ),
            (
                f"attempt {record['attempt']}: the step count goes on from the checkpoint's step {saved_step}",
                record["step"] == saved_step and min(steps, saved_step + every) in committed,
                f"resumed at step {record['step']}; next checkpoint step-{min(steps, saved_step + every)} "
                + ("committed" if min(steps, saved_step + every) in committed else "missing"),
            ),
        ]
    checks.append(
        (
            "the run reached its last step",
            steps in committed,
            f"last committed step {max(committed, default=None)}",
        )
    )
    return all([timeline.check(name, ok, detail) for name, ok, detail in checks])
