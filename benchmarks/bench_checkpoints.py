"""Metadata-level verification of DCP checkpoints against listing them, HEADing them, and torch's own read.

Run: ``.venv/bin/python benchmarks/bench_checkpoints.py``.  Two committed torchtitan (DCP)
checkpoints are uploaded to a local S3 server:

- synthetic: 10,000 shard files and a ``.metadata`` pickled from torch's own metadata classes
  (what ``FileSystemWriter.finish`` pickles), one tensor per shard;
- real: 10,000 tensors saved by ``torch.distributed.checkpoint`` from two gloo ranks, each tensor
  a DTensor sharded across both (20,000 chunks in two shard files).

Every figure is the best of ``RUNS`` (the real checkpoint's: ``REAL_RUNS``, for both sides) in this process (the sandbox's reader already started, as in any
process that verified once; its cold start is printed as ``cold=``).  For the synthetic one, ``verify``
at the metadata level (one listing plus reads of the manifest, ``_COMMITTED`` and ``.metadata``) against
(a) listing the prefix alone, the floor, and (b) the naive check: the listing, then one HEAD per
object with ``HEADS_IN_FLIGHT`` in flight.  For the real one, ``verify`` against torch's own trusting read
of the same ``.metadata``: its GET and ``pickle.loads`` with torch's classes (GC paused, as ours).  Where
our time goes is printed beside it: the listing (``list=``), the restricted read in this process
(``load=``) and through the sandbox's forked child (``sandbox=``).  ``peak`` is this process's Python
allocations; ``child_rss`` the sandbox's peak resident memory.  Exit status 1 if any target is missed.
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

from results import record

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.checkpoints import torch_dcp  # noqa: E402
from tests.support.s3 import local_s3  # noqa: E402
from trainops.checkpoints.formats import dcp_metadata, sandbox  # noqa: E402
from trainops.checkpoints.helper import commit  # noqa: E402
from trainops.checkpoints.store import CheckpointStore  # noqa: E402
from trainops.checkpoints.verify import verify_checkpoint  # noqa: E402

SHARDS = 10_000
TENSORS = 10_000
SHARD_BYTES = 64
RUNS = 3
REAL_RUNS = 7  # the real checkpoint's reads take well under a second: more tries find the machine quiet
HEADS_IN_FLIGHT = 32  # boto3's and the AWS CLI's usual pool size
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


def torch_read(store: CheckpointStore) -> None:
    """What torch does to read the real checkpoint's metadata: GET ``.metadata``, ``pickle.loads`` it
    with its own classes (GC paused, as ours is)."""
    data = store.read(BUCKET, REAL + ".metadata", limit=1 << 30)
    gc.disable()
    try:
        pickle.loads(data)
    finally:
        gc.enable()


def in_process_read(data: bytes) -> None:
    """The restricted read and check alone, as the sandbox's child does them (GC paused)."""
    gc.disable()
    try:
        dcp_metadata.shard_requirements(dcp_metadata.load_metadata(data))
    finally:
        gc.enable()


def child_rss_mib(data: bytes) -> float:
    """The sandbox's peak RSS reading ``data``: measured from a fresh process whose only child it is."""
    code = (
        "import resource, sys\n"
        "from trainops.checkpoints.formats.sandbox import read_requirements, stop_reader\n"
        "read_requirements(sys.stdin.buffer.read())\n"
        "stop_reader()\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True).stdout
    return int(out) / 1024


def head_each(client) -> None:
    """The naive check: list the prefix, then HEAD every object, ``HEADS_IN_FLIGHT`` at a time."""
    paginator = client.get_paginator("list_objects_v2")
    keys = [
        item["Key"]
        for page in paginator.paginate(Bucket=BUCKET, Prefix=SYNTHETIC)
        for item in page["Contents"]
    ]
    with ThreadPoolExecutor(HEADS_IN_FLIGHT) as pool:
        list(pool.map(lambda key: client.head_object(Bucket=BUCKET, Key=key), keys))


def measure(
    client, store: CheckpointStore, prefix: str, files: int, runs: int = RUNS
) -> tuple[float, float, float] | None:
    """(listing floor, verify, peak MiB) for the checkpoint at ``prefix``; None if it does not verify."""
    uri = f"s3://{BUCKET}/{prefix}"
    result = verify_checkpoint(uri, store=store)
    if not result.ok or result.files != files:
        print(f"bench checkpoint_verify: {uri} did not verify: {result.reasons[:3]} FAIL")
        record("checkpoint_verify", passed=False, error=f"{uri} did not verify: {result.reasons[:3]}")
        return None
    list_s = best_of(runs, lambda: list_floor(client, prefix))
    verify_s = best_of(runs, lambda: verify_checkpoint(uri, store=store))
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
        data = (real / ".metadata").read_bytes()
        start = time.perf_counter()
        sandbox.read_requirements(data)
        cold_s = time.perf_counter() - start

        synthetic = measure(client, store, SYNTHETIC, SHARDS + 3)
        head_s = best_of(RUNS, lambda: head_each(client))
        real_files = len(list(real.iterdir())) + 2
        measured = measure(client, store, REAL, real_files, REAL_RUNS)
        torch_s = best_of(REAL_RUNS, lambda: torch_read(store))
        load_s = best_of(REAL_RUNS, lambda: in_process_read(data))
        sandbox_s = best_of(REAL_RUNS, lambda: sandbox.read_requirements(data))
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
    list_ratio, head_speedup, torch_ratio = verify_s / list_s, head_s / verify_s, real_verify_s / torch_s
    lines = [
        (
            "checkpoint_verify_vs_list",
            f"verify={verify_s:.2f}s list={list_s:.2f}s peak={peak_mib:.1f}MiB",
            f"ratio={list_ratio:.2f} target<=1.5",
            list_ratio <= 1.5,
            (list_ratio, "<=1.5", {"verify_s": verify_s, "list_s": list_s, "peak_mib": peak_mib}),
        ),
        (
            "checkpoint_verify_vs_head",
            f"verify={verify_s:.2f}s head={head_s:.2f}s ({HEADS_IN_FLIGHT} in flight)",
            f"ratio={head_speedup:.1f} target>=3",
            head_speedup >= 3,
            (
                head_speedup,
                ">=3",
                {"verify_s": verify_s, "head_s": head_s, "heads_in_flight": HEADS_IN_FLIGHT},
            ),
        ),
        (
            "checkpoint_real_dcp_verify_vs_torch_read",
            f"verify={real_verify_s:.3f}s torch_read={torch_s:.3f}s (list={real_list_s:.3f}s load={load_s:.3f}s "
            f"sandbox={sandbox_s:.3f}s cold={cold_s:.2f}s) peak={real_peak_mib:.1f}MiB child_rss={rss_mib:.0f}MiB",
            f"ratio={torch_ratio:.2f} target<=2",
            torch_ratio <= 2,
            (
                torch_ratio,
                "<=2",
                {
                    "verify_s": real_verify_s,
                    "torch_read_s": torch_s,
                    "cold_s": cold_s,
                    "child_rss_mib": rss_mib,
                },
            ),
        ),
    ]
    for name, figures, target, passed, (ratio, target_value, values) in lines:
        print(f"bench {name}: {figures} {target} {'PASS' if passed else 'FAIL'}")
        rounded = {
            key: round(value, 3) if isinstance(value, float) else value for key, value in values.items()
        }
        record(name, passed=passed, ratio=round(ratio, 3), target=target_value, **rounded)
    return 0 if all(line[3] for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
