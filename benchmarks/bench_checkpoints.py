"""Metadata-level verification of DCP checkpoints against listing them and against HEADing them.

Run: ``.venv/bin/python benchmarks/bench_checkpoints.py``.  Two committed torchtitan (DCP)
checkpoints are uploaded to a local S3 server:

- synthetic: 10,000 shard files and a ``.metadata`` pickled from torch's own metadata classes
  (what ``FileSystemWriter.finish`` pickles), one tensor per shard;
- real: 10,000 tensors saved by ``torch.distributed.checkpoint`` from two gloo ranks, each tensor
  a DTensor sharded across both (20,000 chunks in two shard files).

For each, in the same run, we time (a) listing the prefix alone, the floor, and (b)
``verify_checkpoint`` at the metadata level (one listing plus reads of the manifest,
``_COMMITTED`` and ``.metadata``); for the synthetic one also (c) one HEAD per object, the naive
loop.  For the real one two more references are printed: the floor of any metadata-level
verifier, listing plus the GET of ``.metadata`` (``read=``), and that plus torch's own trusting
``pickle.load`` of it (``torch_read=``); ``floor_ratio`` is ``read`` against the listing, the best any
verifier that reads ``.metadata`` can reach.  Where the time goes is printed beside it, measured in this
process on the same bytes: the opcode pre-scan (``scan=``) and the restricted read (``load=``); the rest
is the GETs and the sandbox child's start.  ``peak`` is this process's Python allocations;
``child_rss`` the sandbox child's peak resident memory.  Exit status 1 if any target is missed.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.checkpoints import torch_dcp  # noqa: E402
from tests.support.s3 import local_s3  # noqa: E402
from trainops.checkpoints.formats import dcp_metadata, pickle_scan  # noqa: E402
from trainops.checkpoints.helper import commit  # noqa: E402
from trainops.checkpoints.store import CheckpointStore  # noqa: E402
from trainops.checkpoints.verify import verify_checkpoint  # noqa: E402

SHARDS = 10_000
TENSORS = 10_000
SHARD_BYTES = 64
BUCKET = "bench-checkpoints"
SYNTHETIC = "runs/bench/step-1000/"
REAL = "runs/bench-real/step-1000/"


def synthetic_metadata(names: list[str]) -> bytes:
    """A ``.metadata`` with one bf16 tensor per shard file, pickled from torch's classes."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    items, storage = {}, {}
    for i, name in enumerate(names):
        size = torch.Size([SHARD_BYTES // 2])
        chunk = ChunkStorageMetadata(torch.Size([0]), size)
        items[f"layer{i}.weight"] = TensorStorageMetadata(TensorProperties(torch.bfloat16), size, [chunk])
        storage[MetadataIndex(f"layer{i}.weight", torch.Size([0]), 0)] = _StorageInfo(name, 0, SHARD_BYTES)
    return pickle.dumps(Metadata(items, storage_data=storage, version="1.0.0"))


def upload_synthetic(client) -> None:
    names = [f"__{rank}_0.distcp" for rank in range(SHARDS)]
    with ThreadPoolExecutor(32) as pool:
        list(
            pool.map(
                lambda name: client.put_object(
                    Bucket=BUCKET, Key=SYNTHETIC + name, Body=os.urandom(SHARD_BYTES)
                ),
                names,
            )
        )
    client.put_object(Bucket=BUCKET, Key=SYNTHETIC + ".metadata", Body=synthetic_metadata(names))


def best_of(runs: int, action: Callable[[], object]) -> float:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return min(timings)


def list_floor(client, prefix: str) -> int:
    paginator = client.get_paginator("list_objects_v2")
    return sum(len(page.get("Contents", [])) for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix))


def read_floor(client, store: CheckpointStore) -> bytes:
    """What any metadata-level verifier of the real checkpoint must do: list it, GET ``.metadata``."""
    list_floor(client, REAL)
    return store.read(BUCKET, REAL + ".metadata", limit=1 << 30)


def torch_read(client, store: CheckpointStore) -> None:
    """``read_floor`` plus the trusting ``pickle.loads`` torch itself does, GC paused as ours is."""
    data = read_floor(client, store)
    gc.disable()
    try:
        pickle.loads(data)
    finally:
        gc.enable()


def child_rss_mib(data: bytes) -> float:
    """The sandbox child's peak RSS reading ``data``: measured from a fresh process whose only child it is."""
    code = (
        "import resource, sys\n"
        "from trainops.checkpoints.formats.sandbox import read_requirements\n"
        "read_requirements(sys.stdin.buffer.read())\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True).stdout
    return int(out) / 1024


def head_loop(client) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, Prefix=SYNTHETIC):
        for item in page.get("Contents", []):
            client.head_object(Bucket=BUCKET, Key=item["Key"])


def measure(client, store: CheckpointStore, prefix: str, files: int) -> tuple[float, float, float] | None:
    """(listing floor, verify, peak MiB) for the checkpoint at ``prefix``; None if it does not verify."""
    uri = f"s3://{BUCKET}/{prefix}"
    result = verify_checkpoint(uri, store=store)
    if not result.ok or result.files != files:
        print(f"bench checkpoint_verify: {uri} did not verify: {result.reasons[:3]} FAIL")
        return None
    list_s = best_of(3, lambda: list_floor(client, prefix))
    verify_s = best_of(3, lambda: verify_checkpoint(uri, store=store))
    tracemalloc.start()
    verify_checkpoint(uri, store=store)
    peak_mib = tracemalloc.get_traced_memory()[1] / (1 << 20)
    tracemalloc.stop()
    return list_s, verify_s, peak_mib


def main() -> int:
    import boto3
    from botocore.config import Config

    with tempfile.TemporaryDirectory() as scratch, local_s3() as server:
        start = time.perf_counter()
        real = torch_dcp.write(Path(scratch) / "real", ranks=2, tensors=TENSORS)
        save_s = time.perf_counter() - start
        for key, value in server.env().items():
            os.environ[key] = value
        client = boto3.client("s3", config=Config(max_pool_connections=32))
        client.create_bucket(Bucket=BUCKET)
        start = time.perf_counter()
        upload_synthetic(client)
        upload_s = time.perf_counter() - start
        torch_dcp.upload(client, BUCKET, REAL, real)
        start = time.perf_counter()
        commit(f"s3://{BUCKET}/{SYNTHETIC}")
        commit_s = time.perf_counter() - start
        commit(f"s3://{BUCKET}/{REAL}")
        store = CheckpointStore(client)

        synthetic = measure(client, store, SYNTHETIC, SHARDS + 3)
        head_s = best_of(1, lambda: head_loop(client))
        real_files = len(list(real.iterdir())) + 2
        measured = measure(client, store, REAL, real_files)
        read_s = best_of(3, lambda: read_floor(client, store))
        torch_s = best_of(3, lambda: torch_read(client, store))
        data = (real / ".metadata").read_bytes()
        scan_s = best_of(3, lambda: pickle_scan.scan(data))
        load_s = best_of(3, lambda: dcp_metadata.read_requirements(data))
        rss_mib = child_rss_mib(data)
        metadata_mib = len(data) / (1 << 20)
    if synthetic is None or measured is None:
        return 1

    print(
        f"# synthetic: {SHARDS} shards + .metadata + manifest + _COMMITTED; upload {upload_s:.1f}s, "
        f"commit {commit_s:.2f}s\n# real: {TENSORS} DTensors on 2 gloo ranks, {real_files} files, "
        f".metadata {metadata_mib:.1f} MiB; torch save {save_s:.1f}s"
    )
    (list_s, verify_s, peak_mib), (real_list_s, real_verify_s, real_peak_mib) = synthetic, measured
    list_ratio, head_speedup, real_ratio = verify_s / list_s, head_s / verify_s, real_verify_s / real_list_s
    lines = [
        (
            "checkpoint_verify_vs_list",
            f"verify={verify_s:.2f}s list={list_s:.2f}s peak={peak_mib:.1f}MiB",
            f"ratio={list_ratio:.2f} target<=1.5",
            list_ratio <= 1.5,
        ),
        (
            "checkpoint_verify_vs_head",
            # head_s / list_s is the best any listing-based verify can reach against this server
            f"verify={verify_s:.2f}s head={head_s:.2f}s ceiling={head_s / list_s:.1f}",
            f"ratio={head_speedup:.1f} target>=10",
            head_speedup >= 10,
        ),
        (
            "checkpoint_real_dcp_verify_vs_list",
            f"verify={real_verify_s:.3f}s (scan={scan_s:.3f}s load={load_s:.3f}s) list={real_list_s:.3f}s "
            f"read={read_s:.3f}s torch_read={torch_s:.3f}s peak={real_peak_mib:.1f}MiB "
            f"child_rss={rss_mib:.0f}MiB",
            f"ratio={real_ratio:.2f} floor_ratio={read_s / real_list_s:.1f} target<=1.5",
            real_ratio <= 1.5,
        ),
    ]
    for name, figures, target, passed in lines:
        print(f"bench {name}: {figures} {target} {'PASS' if passed else 'FAIL'}")
    return 0 if all(passed for *_, passed in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
