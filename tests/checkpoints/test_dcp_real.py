"""Checkpoints written by the installed torch with ``torch.distributed.checkpoint`` verify in S3, and
damaged ones do not: single rank and two gloo ranks, with ``save`` and ``async_save``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.checkpoints import torch_dcp
from tests.checkpoints.builders import prefix_of, put
from trainops.checkpoints.latest import latest_verified
from trainops.checkpoints.verify import verify_checkpoint

KINDS = [(1, False), (1, True), (2, False), (2, True)]
KIND_IDS = ["one-rank", "one-rank-async", "two-ranks", "two-ranks-async"]


def upload(client, bucket: str, run: str, name: str, ranks: int = 2, async_save: bool = False) -> str:
    """Upload a real checkpoint as ``<run><name>/``; returns its URI."""
    torch_dcp.upload(client, bucket, prefix_of(run) + f"{name}/", torch_dcp.checkpoint(ranks, async_save))
    return f"{run}{name}/"


@pytest.mark.parametrize("ranks, async_save", KINDS, ids=KIND_IDS)
def test_real_checkpoint_verifies(client, bucket, run, ranks, async_save):
    uri = upload(client, bucket, run, "step-100", ranks, async_save)

    result = verify_checkpoint(uri)

    assert result.ok, result.reasons
    shards = [f"__{rank}_0.distcp" for rank in range(ranks)]
    assert sorted(path.name for path in torch_dcp.checkpoint(ranks, async_save).iterdir()) == [
        ".metadata",
        *shards,
    ]
    assert (result.format, result.step, result.files) == ("torchtitan", 100, ranks + 1)


@pytest.mark.parametrize("ranks, async_save", KINDS, ids=KIND_IDS)
def test_real_shard_one_byte_short_is_truncated(client, bucket, run, ranks, async_save):
    uri = upload(client, bucket, run, "step-100", ranks, async_save)
    shard = f"__{ranks - 1}_0.distcp"
    body = (torch_dcp.checkpoint(ranks, async_save) / shard).read_bytes()
    put(client, bucket, prefix_of(uri) + shard, body[:-1])

    result = verify_checkpoint(uri)

    assert not result.ok
    assert result.reasons == [
        f"{shard} is {len(body) - 1} bytes but .metadata needs at least {len(body)} (offset+length): truncated"
    ]


def test_real_checkpoint_without_metadata_is_incomplete(client, bucket, run):
    uri = upload(client, bucket, run, "step-100")
    client.delete_object(Bucket=bucket, Key=prefix_of(uri) + ".metadata")

    result = verify_checkpoint(uri)

    assert not result.ok
    assert result.reasons == [".metadata is missing: DCP writes it last, so the save did not finish"]


def test_real_checkpoint_missing_a_shard_is_incomplete(client, bucket, run):
    uri = upload(client, bucket, run, "step-100", async_save=True)
    client.delete_object(Bucket=bucket, Key=prefix_of(uri) + "__0_0.distcp")

    result = verify_checkpoint(uri)

    assert not result.ok
    assert result.reasons == ["__0_0.distcp is missing (referenced by .metadata)"]


def test_latest_is_the_newest_real_checkpoint_that_verifies(client, bucket, run):
    upload(client, bucket, run, "step-100")
    upload(client, bucket, run, "step-200", async_save=True)
    truncated = upload(client, bucket, run, "step-300", ranks=1)
    put(client, bucket, prefix_of(truncated) + "__0_0.distcp", b"\x00" * 100)
    unfinished = upload(client, bucket, run, "step-400")
    client.delete_object(Bucket=bucket, Key=prefix_of(unfinished) + ".metadata")

    latest = latest_verified(run)

    assert latest.checkpoint is not None and latest.checkpoint.uri == f"{run}step-200/"
    assert [result.uri for result in latest.skipped] == [unfinished, truncated]
    assert "truncated" in latest.skipped[1].reasons[0]


WIDE = """
import pickle, sys, torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties, TensorStorageMetadata)
ranks, tensors = int(sys.argv[1]), int(sys.argv[2])
items, storage = {}, {}
for t in range(tensors):
    fqn, chunks = f"layers.{t}.weight", []
    for rank in range(ranks):  # row-sharded across every rank, 4 bf16 values each
        offsets = torch.Size([rank, 0])
        chunks.append(ChunkStorageMetadata(offsets, torch.Size([1, 4])))
        storage[MetadataIndex(fqn, offsets)] = _StorageInfo(f"__{rank}_0.distcp", 8 * t, 8)
    items[fqn] = TensorStorageMetadata(TensorProperties(torch.bfloat16), torch.Size([ranks, 4]), chunks)
sys.stdout.buffer.write(pickle.dumps(Metadata(items, storage_data=storage)))
"""


def test_a_wide_runs_metadata_over_32_mib_verifies(client, bucket, run):
    """A run sharded over many ranks writes one chunk per tensor per rank: 256 ranks x 1,200 tensors
    (307,200 chunks) is a .metadata over 32 MiB, which must verify like a small one."""
    ranks, tensors = 256, 1200
    metadata = subprocess.run(
        [sys.executable, "-c", WIDE, str(ranks), str(tensors)], capture_output=True, check=True
    ).stdout
    assert len(metadata) > 32 << 20
    prefix = prefix_of(run) + "step-100/"
    for rank in range(ranks):
        put(client, bucket, f"{prefix}__{rank}_0.distcp", bytes(8 * tensors))
    put(client, bucket, prefix + ".metadata", metadata)

    result = verify_checkpoint(f"{run}step-100/")

    assert result.ok, result.reasons
    assert result.files == ranks + 1
