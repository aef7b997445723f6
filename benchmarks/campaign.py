"""A seeded fault campaign over the capacity procedures (claim, give_back) on one devcluster.

Each run draws from its seed a run key, 2-4 GPU nodes (idle and busy with inference) and one fault:
API bursts (429/503 on node writes, evictions and pod lists), a claim killed halfway (a 500 on
one node's write, after which the reaper's give_back returns what was claimed), a rival controller
writing the same nodes (409s), a second run racing for overlapping nodes, or a quarantined node
among the candidates.  After every run and its return it checks the invariants:

- no node claimed once every run has returned, and no node held by two runs;
- a quarantined node is never claimed (the claim refuses and holds nothing);
- the Kueue quota back to zero; every inference Deployment restored (spec) and Ready;
- the cluster otherwise as before the run (nodes and workloads, statuses aside).

It covers the capacity half of a lifecycle run only: no training Job, checkpoints or Airflow.

    python benchmarks/campaign.py --runs 200 --seed 1 --json campaign.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.capacity.helpers import DEPLOYMENTS, default_seeded_objects, kube_for, nodes_by_app, snapshot  # noqa: E402
from trainops.capacity.claims import CLAIMED_BY_ANNOTATION  # noqa: E402
from trainops.capacity.procedure import Deadlines, NodeQuarantined, NodesHeld, claim, give_back  # noqa: E402
from trainops.conventions import QUARANTINE_TAINT  # noqa: E402

FAULTS = ("none", "api-burst", "killed-mid-claim", "rival-writer", "race", "quarantined-candidate")
DEADLINES = Deadlines(api_s=60, drain_s=120, ready_s=120, drain_stall_s=10)
QUEUE = "training"


@dataclass
class Report:
    runs: int = 0
    faults: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    return_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "runs": self.runs,
            "faults": dict(self.faults),
            "violations": len(self.violations),
            "violation_details": self.violations[:50],
            "median_return_s": round(statistics.median(self.return_s), 3) if self.return_s else None,
        }


def holders(cluster) -> dict[str, str]:
    return {
        n["metadata"]["name"]: h
        for n in cluster.store.list("nodes")[0]
        if (h := (n["metadata"].get("annotations") or {}).get(CLAIMED_BY_ANNOTATION))
    }


def gpu_quota(cluster) -> str:
    queue = cluster.store.get("clusterqueues.kueue.x-k8s.io", "", QUEUE)
    resources = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return next(str(r["nominalQuota"]) for r in resources if r["name"] == "nvidia.com/gpu")


def _set_quarantine(cluster, node: str, on: bool) -> None:
    def change(obj: dict) -> None:
        taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != QUARANTINE_TAINT]
        if on:
            taints.append({"key": QUARANTINE_TAINT, "value": "campaign", "effect": "NoSchedule"})
        obj["spec"]["taints"] = taints

    cluster.store.mutate("nodes", "", node, change)


def one_run(cluster, index: int, rng: random.Random, report: Report, quota_before: str) -> None:
    fault = rng.choice(FAULTS)  # drawn first: the faults of a seed do not depend on the cluster's size
    where = nodes_by_app(cluster)
    pool = where["idle"] + where["llm-chat"] + where["embeddings"]
    nodes = sorted(rng.sample(pool, rng.randint(2, 4)))
    run, rival = f"campaign/run_{index}", f"campaign/rival_{index}"
    kube = kube_for(cluster)
    report.runs += 1
    report.faults[fault] += 1
    before = snapshot(cluster)
    bad = report.violations.append
    stop = threading.Event()
    threads: list[threading.Thread] = []
    outcomes: dict[str, object] = {}

    def attempt(key: str, names: list[str]) -> None:
        try:
            outcomes[key] = claim(
                kube_for(cluster),
                key,
                names,
                cluster_queue=QUEUE,
                deployments=DEPLOYMENTS,
                deadlines=DEADLINES,
            )
        except Exception as error:  # the outcome under test; checked below
            outcomes[key] = error

    if fault == "api-burst":
        for path, status in (
            (r"/api/v1/nodes/", 503),
            (r"/api/v1/nodes/", 429),
            (r"/eviction$", 429),
            (r"/pods", 503),
        ):
            cluster.inject("api-fault", path=path, status=status, fraction=0.3)
    elif fault == "killed-mid-claim":
        cluster.inject("api-fault", path=f"/api/v1/nodes/{nodes[-1]}$", status=500, count=1)
    elif fault == "quarantined-candidate":
        _set_quarantine(cluster, nodes[0], True)
    elif fault == "rival-writer":

        def churn() -> None:
            while not stop.is_set():
                for name in nodes:
                    cluster.store.mutate(
                        "nodes", "", name, lambda n: n["metadata"].setdefault("labels", {}).update(churn="x")
                    )
                    cluster.store.mutate("nodes", "", name, lambda n: n["metadata"]["labels"].pop("churn"))
                stop.wait(0.02)

        threads.append(threading.Thread(target=churn, daemon=True))
    elif fault == "race":
        other = sorted({*nodes[1:], *rng.sample(pool, 2)})
        threads.append(threading.Thread(target=attempt, args=(rival, other)))
    for thread in threads:
        thread.start()
    try:
        attempt(run, nodes)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        cluster.server.faults.clear()

    held = holders(cluster)
    if fault == "race":  # a loser may hold what it claimed before it lost, until its teardown
        for key, outcome in outcomes.items():
            if not isinstance(outcome, Exception) and any(held.get(n) != key for n in outcome.node_names):
                bad(f"run {index}: {key} was granted nodes another run holds: {held}")
    if fault == "quarantined-candidate":
        if not isinstance(outcomes[run], NodeQuarantined) or held:
            bad(f"run {index}: a quarantined node's claim: {outcomes[run]!r}, held {held}")
        _set_quarantine(cluster, nodes[0], False)
    elif fault in ("none", "api-burst", "rival-writer") and isinstance(outcomes[run], Exception):
        bad(f"run {index} ({fault}): the claim failed: {outcomes[run]!r}")
    elif fault == "race" and not all(
        isinstance(v, NodesHeld) or not isinstance(v, Exception) for v in outcomes.values()
    ):
        bad(f"run {index}: a racing claim failed other than NodesHeld: {outcomes}")

    started = time.monotonic()
    for key in (run, rival):  # the runs' teardown (or the reaper), whatever their claims did
        try:
            give_back(kube, key, cluster_queue=QUEUE, deadlines=DEADLINES)
        except Exception as error:  # a failed return is a violation, not a crash of the campaign
            bad(f"run {index}: give_back({key}) raised {error!r}")
    report.return_s.append(time.monotonic() - started)

    if holders(cluster):
        bad(f"run {index}: nodes still claimed after the return: {holders(cluster)}")
    if gpu_quota(cluster) != quota_before:
        bad(f"run {index}: the GPU quota is {gpu_quota(cluster)}, was {quota_before}")
    try:
        cluster.wait_until_settled(timeout=60)
    except TimeoutError:
        bad(f"run {index}: inference not Ready within 60 s of the return")
    if snapshot(cluster) != before:
        bad(f"run {index} ({fault}): the cluster differs from before the run")


def campaign(runs: int, seed: int, *, nodes: int = 16) -> Report:
    from trainops_devcluster.cluster import DevCluster

    report = Report()
    with DevCluster(nodes=nodes, gpus_per_node=8) as cluster:
        cluster.wait_until_settled()
        default_seeded_objects(cluster)
        quota_before = gpu_quota(cluster)
        for index in range(runs):
            one_run(cluster, index, random.Random(seed * 1_000_003 + index), report, quota_before)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = campaign(args.runs, args.seed).to_dict()
    result["seed"], result["wall_s"] = args.seed, round(time.monotonic() - started, 1)
    print(f"runs {result['runs']}  seed {args.seed}  wall {result['wall_s']} s")
    for kind, count in sorted(result["faults"].items()):
        print(f"  fault {kind:<22} {count}")
    print(f"violations {result['violations']}  median return {result['median_return_s']} s")
    for line in result["violation_details"]:
        print("  " + line)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
