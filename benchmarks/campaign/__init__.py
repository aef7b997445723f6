"""A seeded fault campaign: lifecycle runs on one devcluster and one local S3 server, one fault each.

Every run is the lifecycle the DAG runs (``lifecycle.py``), through the core procedures the operators
call (``steps.py``): health gate -> claim (a spare included) -> gang training with the demo trainer
(real checkpoints in S3, resumes) -> verify the final checkpoint -> give back.  Each run draws one
fault kind from its seed (``faults.py``); after it, the invariants (``invariants.py``) are checked.
Then the nodes it broke are repaired and released, so every run starts on a whole fleet.

    python -m benchmarks.campaign --runs 200 --seed 1 --json benchmarks/campaign.json

The package keeps the campaign readable in parts: the fault kinds, the Airflow-free steps (also a
child process's entry point, for the SIGKILL kinds), the run driver, the invariants, the report.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from benchmarks.campaign.faults import FAULTS, S3Errors
from benchmarks.campaign.lifecycle import RunResult

__all__ = ["FAULTS", "Report", "campaign", "world"]


@dataclass
class Report:
    runs: list[RunResult] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        return [f"run {r.index} ({r.fault}): {v}" for r in self.runs for v in r.violations]

    @property
    def faults(self) -> Counter:
        return Counter(r.fault for r in self.runs)

    def to_dict(self) -> dict:
        paid = sum(r.paid_steps for r in self.runs)
        failed = [r for r in self.runs if r.outcome != "succeeded"]
        recovered: dict[str, list[float]] = {}  # fault kind -> the recover_s of its runs that have one
        for r in self.runs:
            if r.recover_s is not None:
                recovered.setdefault(r.fault, []).append(r.recover_s)
        return {
            "runs": len(self.runs),
            "faults": dict(sorted(self.faults.items())),
            "violations": len(self.violations),
            "violation_details": self.violations[:50],
            "succeeded": len(self.runs) - len(failed),
            "failed": [f"run {r.index} ({r.fault}): {r.outcome}" for r in failed][:50],
            "goodput": round(sum(r.useful_steps for r in self.runs) / paid, 3) if paid else None,
            "useful_steps": sum(r.useful_steps for r in self.runs),
            "paid_steps": paid,
            "median_recover_s": median([s for times in recovered.values() for s in times]),
            "recover_s_by_fault": {kind: median(times) for kind, times in sorted(recovered.items())},
            "per_run": [
                {
                    "run": r.index,
                    "fault": r.fault,
                    "outcome": r.outcome[:200],
                    "recover_s": None if r.recover_s is None else round(r.recover_s, 2),
                    "paid_steps": r.paid_steps,
                    "notes": [n[:200] for n in r.notes[:4]],
                }
                for r in self.runs
            ],
        }


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


@contextlib.contextmanager
def world(*, nodes: int = 16) -> Iterator:
    """A devcluster whose trainer pods and this process talk to one local S3 server, and its World."""
    import boto3
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.local_s3 import local_s3

    from benchmarks.campaign.lifecycle import World
    from trainops.checkpoints.store import CheckpointStore

    with local_s3() as s3, _environ(s3.env()):
        with DevCluster(nodes=nodes, gpus_per_node=8, process_env=s3.env()) as cluster:
            cluster.wait_until_settled()
            client = boto3.client("s3", endpoint_url=s3.endpoint_url)
            errors = S3Errors(client, random.Random(0))
            yield World(cluster, s3.create_bucket("campaign"), CheckpointStore(client), errors)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def campaign(
    runs: int, seed: int, *, nodes: int = 16, kinds: tuple[str, ...] = FAULTS, progress=None
) -> Report:
    """``runs`` lifecycle runs; run ``i`` draws its fault from ``kinds`` with ``Random(seed, i)``."""
    from benchmarks.campaign.lifecycle import Run

    report = Report()
    with world(nodes=nodes) as w:
        for index in range(runs):
            rng = random.Random(seed * 1_000_003 + index)
            result = Run(w, index, rng.choice(kinds), rng).go()
            report.runs.append(result)
            if progress:
                progress(result)
    return report
