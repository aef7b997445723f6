"""The devcluster's Kueue TAS ungater under a burst of node writes, with thousands of finished Workloads.

The ungater (``trainops_devcluster.kueue_ungater.TopologyUngater``) runs as the devcluster's Kueue runs
it: its own thread, fed by the events of a devcluster ``Store``. The store holds ``NODES`` GPU nodes (in
training mode), ``RUNNING`` admitted Workloads of ``PODS`` running pods each placed on them, and, per
size, ``FINISHED`` Workloads that ran on the same nodes and finished (Kueue keeps them, admission and
all, while their Jobs exist; the fault campaign's devcluster held 600). Each Workload's topology
assignment is the devcluster's own encoding (v1beta2 slices: block, rack, hostname).

A burst: ``BURST`` node writes as fast as this thread issues them (the campaign's rival writer: a label
set and removed again, over every node), then a gated pod of one more admitted Workload. The ungater
handles events in order, so the pod losing its gate means every node write before it was handled.
Measured per burst: the ungater thread's CPU time over the burst, per node write (the judged figure:
CPU time, so other threads' load does not count) and its lag, from the last write until that pod was
released (reported). Best of ``ROUNDS`` bursts per size, the sizes alternately (each its own store and
ungater, all set up first), in one process.

Lines: ``bench devcluster_ungater_size`` per size (reported), ``bench devcluster_ungater``: the CPU per
node event at the largest size against none finished, ``target<=1.5`` (flat: a node's change costs what
is on it; the scan before commit 62cc727 cost every Workload ever run). Exits 1 on a miss.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

from results import record
from trainops_devcluster import topology
from trainops_devcluster.hardware import NodeProfile
from trainops_devcluster.kueue_api import (
    ADMITTED,
    FINISHED,
    PODSET_LABEL,
    QUOTA_RESERVED,
    WORKLOAD_ANNOTATION,
    WORKLOADS,
)
from trainops_devcluster.kueue_tas import GATE, HOSTNAME, POD_INDEX_LABEL, encode
from trainops_devcluster.kueue_ungater import TopologyUngater
from trainops_devcluster.store import Store

from trainops.conventions import MODE_TAINT, MODE_TRAINING
from trainops.placement.request import BLOCK_LABEL, RACK_LABEL

FINISHED_SIZES = (0, 1000, 5000)
NODES = 64  # 4 blocks of 4 racks of 4 nodes
PODS = 4  # each Workload's pods, one a node
RUNNING = 4  # admitted, unfinished Workloads placed on the nodes (their pods running)
BURST = 3000  # node writes a burst (the rival writer wrote 300 a second, two per node)
ROUNDS = 8  # the machine is shared: the best of 8 finds each size a quiet moment
TARGET = 1.5
NAMESPACE = "training"
TOLERATION = {"key": MODE_TAINT, "operator": "Equal", "value": MODE_TRAINING, "effect": "NoSchedule"}
LEVELS = [BLOCK_LABEL, RACK_LABEL, HOSTNAME]


def load() -> str:
    return "load=" + "/".join(f"{x:.1f}" for x in os.getloadavg())


def node(index: int) -> dict:
    obj = topology.gpu_node(index, NodeProfile(gpus=8))
    obj["spec"]["taints"] = [{"key": MODE_TAINT, "value": MODE_TRAINING, "effect": "NoSchedule"}]
    obj["metadata"]["labels"].update({BLOCK_LABEL: block(index), RACK_LABEL: rack(index)})
    return obj


def block(index: int) -> str:
    return f"block-{'abcd'[index // 16]}"


def rack(index: int) -> str:
    return f"rack-{index // 4:02d}"


def workload(name: str, first_node: int, *, finished: bool) -> dict:
    """An admitted Workload of PODS pods on PODS consecutive nodes, as Kueue's TAS leaves it."""
    indexes = [(first_node + i) % NODES for i in range(PODS)]
    domains = [([block(i), rack(i), topology.node_name(i)], 1) for i in indexes]
    conditions = [
        {"type": QUOTA_RESERVED, "status": "True", "reason": "QuotaReserved", "message": "Quota reserved"},
        {"type": ADMITTED, "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
    ]
    if finished:
        conditions.append(
            {"type": FINISHED, "status": "True", "reason": "Succeeded", "message": "Job finished"}
        )
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "queueName": "training",
            "podSets": [
                {
                    "name": "main",
                    "count": PODS,
                    "template": {"spec": {"tolerations": [TOLERATION], "containers": [{"name": "trainer"}]}},
                }
            ],
        },
        "status": {
            "admission": {
                "clusterQueue": "training",
                "podSetAssignments": [
                    {"name": "main", "count": PODS, "topologyAssignment": encode(LEVELS, domains, "v1beta2")}
                ],
            },
            "conditions": conditions,
        },
    }


def pod(workload_name: str, rank: int, node_index: int, *, gated: bool) -> dict:
    spec: dict = {"tolerations": [TOLERATION], "containers": [{"name": "trainer", "image": "trainer:1"}]}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
        status = {"phase": "Pending"}
    else:
        spec["nodeSelector"] = {
            BLOCK_LABEL: block(node_index),
            RACK_LABEL: rack(node_index),
            HOSTNAME: topology.node_name(node_index),
        }
        spec["nodeName"] = topology.node_name(node_index)
        status = {"phase": "Running"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workload_name}-{rank}",
            "namespace": NAMESPACE,
            "labels": {PODSET_LABEL: "main", POD_INDEX_LABEL: str(rank)},
            "annotations": {WORKLOAD_ANNOTATION: workload_name},
        },
        "spec": spec,
        "status": status,
    }


class Released:
    """A store listener: when a pod named ``name`` lost its scheduling gate (set ``name`` first)."""

    def __init__(self) -> None:
        self.name, self.at, self.done = "", 0.0, threading.Event()

    def __call__(self, event) -> None:
        meta, spec = event.object["metadata"], event.object.get("spec") or {}
        if event.resource == "pods" and meta["name"] == self.name and not spec.get("schedulingGates"):
            self.at = time.perf_counter()
            self.done.set()


def cluster(finished: int) -> tuple[Store, TopologyUngater, Released]:
    store = Store()
    store.create("namespaces", topology.namespace(NAMESPACE))
    for index in range(NODES):
        store.create("nodes", node(index))
    for index in range(finished):
        store.create(WORKLOADS, workload(f"done-{index:05d}", index * PODS, finished=True))
    for index in range(RUNNING):
        name = f"running-{index}"
        first = index * NODES // RUNNING
        store.create(WORKLOADS, workload(name, first, finished=False))
        for rank in range(PODS):
            store.create("pods", pod(name, rank, (first + rank) % NODES, gated=False))
    released = Released()
    store.add_listener(released)
    ungater = TopologyUngater(store)
    ungater.start()
    settle(store, ungater, released, "settled")
    return store, ungater, released


def settle(store: Store, ungater: TopologyUngater, released: Released, name: str) -> float:
    """A new admitted Workload and its gated pod; waits until the ungater released it (every event
    before it handled); returns when, by ``time.perf_counter``."""
    first = len(name) % NODES
    released.name, released.done = f"{name}-0", threading.Event()
    store.create(WORKLOADS, workload(name, first, finished=False))
    store.create("pods", pod(name, 0, first, gated=True))
    if not released.done.wait(timeout=1800):
        raise RuntimeError(f"the ungater did not release {released.name} in 30 minutes")
    store.mutate(WORKLOADS, NAMESPACE, name, finish)  # it ran and finished: not one more running Workload
    return released.at


def finish(w: dict) -> None:
    w["status"]["conditions"].append(
        {"type": FINISHED, "status": "True", "reason": "Succeeded", "message": "Job finished"}
    )


def burst(
    store: Store, ungater: TopologyUngater, released: Released, round_: int
) -> tuple[float, float, float]:
    """One burst; returns (the ungater's CPU seconds per node write, its lag after the last write, the
    writes' own seconds)."""
    clock = time.pthread_getcpuclockid(ungater._thread.ident)
    cpu0, start = time.clock_gettime(clock), time.perf_counter()
    for write in range(BURST // 2):
        name = topology.node_name(write % NODES)
        store.mutate("nodes", "", name, lambda n: n["metadata"]["labels"].update(churn="x"))
        store.mutate("nodes", "", name, lambda n: n["metadata"]["labels"].pop("churn"))
    written = time.perf_counter()
    caught_up = settle(store, ungater, released, f"after-{round_}")
    cpu = time.clock_gettime(clock) - cpu0
    return cpu / BURST, caught_up - written, written - start


def main() -> int:
    clusters = {finished: cluster(finished) for finished in FINISHED_SIZES}
    rounds: dict[int, list] = {finished: [] for finished in FINISHED_SIZES}
    try:
        for round_ in range(ROUNDS):  # the sizes alternately, so the machine's load hits each alike
            for finished, (store, ungater, released) in clusters.items():
                rounds[finished].append(burst(store, ungater, released, round_))
    finally:
        for _, ungater, _ in clusters.values():
            ungater.stop()
    per_event = {}
    for finished in FINISHED_SIZES:
        measured = rounds[finished]
        cpu, lag = min(r[0] for r in measured), statistics.median(r[1] for r in measured)
        writes = statistics.median(r[2] for r in measured)
        per_event[finished] = cpu
        print(
            f"bench devcluster_ungater_size: finished_workloads={finished} running={RUNNING} nodes={NODES} "
            f"burst={BURST} node writes ({writes:.2f}s to write) ungater_cpu_per_node_event={cpu * 1e6:.1f}us "
            f"lag_after_burst={lag:.3f}s (best/median of {ROUNDS}; reported) ({load()})",
            flush=True,
        )
        record(
            "devcluster_ungater_size",
            finished_workloads=finished,
            cpu_per_node_event_us=round(cpu * 1e6, 1),
            lag_after_burst_s=round(lag, 3),
            burst=BURST,
        )
    small, large = min(FINISHED_SIZES), max(FINISHED_SIZES)
    ratio = per_event[large] / per_event[small]
    passed = ratio <= TARGET
    print(
        f"bench devcluster_ungater: cpu per node event with {large} finished Workloads "
        f"{per_event[large] * 1e6:.1f}us vs {small} {per_event[small] * 1e6:.1f}us ratio={ratio:.2f} "
        f"target<={TARGET} {'PASS' if passed else 'FAIL'} ({load()})",
        flush=True,
    )
    record(
        "devcluster_ungater",
        passed=passed,
        ratio=round(ratio, 3),
        target=f"<={TARGET}",
        **{f"cpu_per_node_event_us_at_{n}": round(per_event[n] * 1e6, 1) for n in FINISHED_SIZES},
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
