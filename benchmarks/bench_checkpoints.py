"""Metadata-level verification of a 10,000-shard checkpoint against listing it and against HEADing it.

Run: ``.venv/bin/python benchmarks/bench_checkpoints.py``.  A committed torchtitan (DCP)
checkpoint is uploaded to a local S3 server; in the same run we time (a) listing the prefix
alone, the floor, (b) one HEAD per object, the naive loop, and (c) ``verify_checkpoint`` at the
metadata level (one listing plus reads of the manifest, ``_COMMITTED`` and ``.metadata``).
Exit status 1 if any target is missed.
"""

from __future__ import annotations

import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.checkpoints.torch_standin import dcp_metadata  # noqa: E402
from tests.support.s3 import local_s3  # noqa: E402
from trainops.checkpoints.helper import commit  # noqa: E402
from trainops.checkpoints.store import CheckpointStore  # noqa: E402
from trainops.checkpoints.verify import verify_checkpoint  # noqa: E402

SHARDS = 10_000
SHARD_BYTES = 64
BUCKET = "bench-checkpoints"
PREFIX = "runs/bench/step-1000/"


def upload_checkpoint(client) -> None:
    names = [f"__{rank}_0.distcp" for rank in range(SHARDS)]
    with ThreadPoolExecutor(32) as pool:
        list(
            pool.map(
                lambda name: client.put_object(
                    Bucket=BUCKET, Key=PREFIX + name, Body=os.urandom(SHARD_BYTES)
                ),
                names,
            )
        )
    metadata = dcp_metadata({name: [(f"layer{i}.weight", 0, SHARD_BYTES)] for i, name in enumerate(names)})
    client.put_object(Bucket=BUCKET, Key=PREFIX + ".metadata", Body=metadata)


def best_of(runs: int, action: Callable[[], object]) -> float:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return min(timings)


def list_floor(client) -> int:
    paginator = client.get_paginator("list_objects_v2")
    return sum(len(page.get("Contents", [])) for page in paginator.paginate(Bucket=BUCKET, Prefix=PREFIX))


def head_loop(client) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, Prefix=PREFIX):
        for item in page.get("Contents", []):
            client.head_object(Bucket=BUCKET, Key=item["Key"])


def main() -> int:
    import boto3
    from botocore.config import Config

    with local_s3() as server:
        for key, value in server.env().items():
            os.environ[key] = value
        client = boto3.client("s3", config=Config(max_pool_connections=32))
        client.create_bucket(Bucket=BUCKET)
        start = time.perf_counter()
        upload_checkpoint(client)
        upload_s = time.perf_counter() - start
        start = time.perf_counter()
        commit(f"s3://{BUCKET}/{PREFIX}")
        commit_s = time.perf_counter() - start
        store = CheckpointStore(client)
        uri = f"s3://{BUCKET}/{PREFIX}"

        result = verify_checkpoint(uri, store=store)
        if not result.ok or result.files != SHARDS + 3:
            print(f"bench checkpoint_verify: the checkpoint did not verify: {result.reasons[:3]} FAIL")
            return 1
        list_s = best_of(3, lambda: list_floor(client))
        verify_s = best_of(3, lambda: verify_checkpoint(uri, store=store))
        head_s = best_of(1, lambda: head_loop(client))
        tracemalloc.start()
        verify_checkpoint(uri, store=store)
        peak_mib = tracemalloc.get_traced_memory()[1] / (1 << 20)
        tracemalloc.stop()

    print(
        f"# {SHARDS} shards + .metadata + manifest + _COMMITTED; upload {upload_s:.1f}s, commit {commit_s:.2f}s"
    )
    list_ratio, head_speedup = verify_s / list_s, head_s / verify_s
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
    ]
    for name, figures, target, passed in lines:
        print(f"bench {name}: {figures} {target} {'PASS' if passed else 'FAIL'}")
    return 0 if all(passed for *_, passed in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
