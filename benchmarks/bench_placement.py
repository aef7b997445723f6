"""Placement by the fabric on a fragmented 64-node devcluster (4 blocks of 4 racks of 4 nodes).

Other runs hold nodes scattered over every block, so the free capacity is 5, 4, 6 and 11 nodes. A
16-node run with one spare goes through the real gate, claim and Kueue Topology Aware Scheduling, with
``topology=preferred`` (block level) and, as the baseline in the same run, with no topology (the claim's
least-disruptive choice, Kueue placing the pods among the claimed nodes). Reported: the blocks the run's
pods span against the optimum (the fewest blocks whose free nodes hold the run; target: equal), and
whether its spare sits in those blocks.  Then the pure placement on 500 random fragmented fleets of
other shapes (1-8 blocks of 1-6 racks of 1-8 nodes): how many span the optimum.
"""

from __future__ import annotations

import random
import sys
import time

from results import record
from trainops_devcluster.cluster import DevCluster

from trainops.capacity.procedure import claim, give_back
from trainops.health.gate import GateConfig, run_gate
from trainops.kube.client import JOBS, Kube
from trainops.kube.kueue import topology_domains
from trainops.placement.place import Slot, place
from trainops.placement.request import BLOCK_LABEL, HOSTNAME_LABEL, RACK_LABEL, TopologyRequest
from trainops.training.job import build_job
from trainops.training.spec import TrainingSpec

FABRIC = "/".join(["4,4,4,4"] * 4)
FREE = {"block-a": 5, "block-b": 4, "block-c": 6, "block-d": 11}
RUN_NODES, SPARES = 16, 1


def line(name: str, figures: str, ratio: float, target: float, **values: object) -> bool:
    ok = ratio <= target
    print(
        f"bench {name}: {figures} ratio={ratio:.2f} target={target:g} {'PASS' if ok else 'FAIL'}", flush=True
    )
    record(name, passed=ok, ratio=round(ratio, 3), target=f"<={target:g}", **values)
    return ok


def optimum(free: dict[str, int], count: int) -> int:
    """The fewest blocks whose free nodes hold ``count``."""
    ranked = sorted(free.values(), reverse=True)
    return next(k for k in range(1, len(ranked) + 1) if sum(ranked[:k]) >= count)


def fragment(dev: DevCluster, kube: Kube, rng: random.Random) -> None:
    """Other runs hold every node beyond ``FREE`` per block, scattered over the block's racks."""
    by_block: dict[str, list[str]] = {}
    for node in dev.store.list("nodes")[0]:
        block = (node["metadata"].get("labels") or {}).get(BLOCK_LABEL)
        if block:
            by_block.setdefault(block, []).append(node["metadata"]["name"])
    for index, (block, names) in enumerate(sorted(by_block.items())):
        held = rng.sample(sorted(names), len(names) - FREE[block])
        claim(kube, f"rival/run-{index}", held, cluster_queue="training")


def run_once(kube: Kube, name: str, topology: TopologyRequest, labels: dict[str, dict]) -> dict:
    """Gate, claim, submit the run's Job and read where Kueue placed its pods."""
    run = f"bench/{name}"
    total = RUN_NODES + SPARES
    gate = run_gate(
        kube.core, GateConfig(min_nodes=total, topology=topology, spares=SPARES, speed_tiers=False)
    )
    summary = claim(
        kube, run, gate.selected, count=total, cluster_queue="training", topology=topology, spares=SPARES
    )
    spec = TrainingSpec(
        image="trainer:1",
        command=["train"],
        run_uri=f"s3://bench/runs/{name}/",
        nodes=RUN_NODES,
        node_names=summary.node_names,
        topology=topology.to_dict() if topology.active else None,
        shm_size=None,
    )
    job = build_job(spec, name=name, dag_id="bench", run_id=name, attempt=1, resume_from=None)
    kube.create(job, JOBS)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workloads = kube.list(
            kube.kueue("workloads"), "training", labels=f"kueue.x-k8s.io/job-uid={_uid(kube, name)}"
        )
        assignment = next(
            (
                psa
                for w in workloads
                for psa in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
            ),
            None,
        )
        if assignment:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"{name}: Kueue did not admit the run within 60 s")
    pods = [values[-1] for values, _ in topology_domains(assignment)[1]]
    kube.delete(JOBS, name, "training", propagation="Foreground")
    give_back(kube, run, cluster_queue="training")
    spares = sorted(set(summary.node_names) - set(pods))
    blocks = {labels[n][BLOCK_LABEL] for n in pods}
    return {
        "blocks": len(blocks),
        "racks": len({(labels[n][BLOCK_LABEL], labels[n][RACK_LABEL]) for n in pods}),
        "spare_home": all(labels[n][BLOCK_LABEL] in blocks for n in spares),
    }


def _uid(kube: Kube, name: str) -> str:
    return kube.get(JOBS, name, "training")["metadata"]["uid"]


def random_fleets(rng: random.Random, fleets: int) -> tuple[int, int, float]:
    """(fleets placed at the optimum, fleets tried, seconds of placement) over random fragmented fleets."""
    at_optimum = tried = 0
    spent = 0.0
    for _ in range(fleets):
        slots, free = [], {}
        for b in range(rng.randint(1, 8)):
            for r in range(rng.randint(1, 6)):
                for n in range(rng.randint(1, 8)):
                    name = f"b{b}-r{r}-n{n}"
                    open_ = rng.random() < 0.55
                    free[f"b{b}"] = free.get(f"b{b}", 0) + open_
                    slots.append(
                        Slot(
                            name,
                            {BLOCK_LABEL: f"b{b}", RACK_LABEL: f"r{r}", HOSTNAME_LABEL: name},
                            int(open_),
                        )
                    )
        total = sum(free.values())
        if total < 2:
            continue
        count = rng.randint(1, total - 1)
        started = time.perf_counter()
        result = place(slots, count, TopologyRequest("preferred", BLOCK_LABEL), spares=1)
        spent += time.perf_counter() - started
        tried += 1
        at_optimum += result.spans(BLOCK_LABEL) == optimum(free, count)
    return at_optimum, tried, spent


def main() -> int:
    rng = random.Random(27)
    with DevCluster(nodes=64, fabric=FABRIC, inference=[], system_nodes=0, probe_interval_s=5.0) as dev:
        dev.wait_until_settled(timeout=300)
        kube = Kube.from_kubeconfig(str(dev.kubeconfig))
        labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in dev.store.list("nodes")[0]}
        fragment(dev, kube, rng)
        placed = run_once(kube, "preferred", TopologyRequest("preferred", BLOCK_LABEL), labels)
        baseline = run_once(kube, "baseline", TopologyRequest(), labels)
    best = optimum(FREE, RUN_NODES)
    ok = line(
        "placement_blocks_spanned",
        f"nodes=64 blocks=4 free={list(FREE.values())} run={RUN_NODES}+{SPARES} spare; topology=preferred spans "
        f"{placed['blocks']} block(s) ({placed['racks']} racks), optimum {best}, spare in the run's blocks: "
        f"{'yes' if placed['spare_home'] else 'NO'}; baseline (no topology) spans {baseline['blocks']} block(s) "
        f"({baseline['racks']} racks)",
        placed["blocks"] / best,
        1.0,
        blocks=placed["blocks"],
        optimum=best,
        racks=placed["racks"],
        spare_in_run_blocks=placed["spare_home"],
        baseline_blocks=baseline["blocks"],
        baseline_racks=baseline["racks"],
    )
    ok = ok and placed["spare_home"]
    at_optimum, tried, spent = random_fleets(rng, 500)
    ok = (
        line(
            "placement_random_fleets",
            f"{at_optimum} of {tried} random fragmented fleets (1-8 blocks x 1-6 racks x 1-8 nodes) span the optimum "
            f"number of blocks; {1000 * spent / max(tried, 1):.2f} ms per placement",
            tried / max(at_optimum, 1),
            1.0,
            at_optimum=at_optimum,
            fleets=tried,
            ms_per_placement=round(1000 * spent / max(tried, 1), 3),
        )
        and ok
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
