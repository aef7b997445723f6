"""Benchmarks of fleet health: the gate at two fleet sizes, and what the node probe writes.

``health_gate`` (at 1,024 and 4,096 nodes, and 8,192 with ``BENCH_LARGE=1``, as ``make bench
BENCH_LARGE=1`` runs it: its devcluster's setup alone has outlasted 50 minutes on a busy 2-core machine;
``--nodes`` picks others): the gate against the floor
of reading its inputs on the same devcluster, alternately, best of ``ROUNDS``. The floor issues
the gate's own reads the gate's way: one paginated list of the candidate nodes and then of the
probes' report ConfigMaps, while a second thread sends the very PromQL queries the gate sent
(recorded from a first gate run: aggregated ``max by (node, gpu)``, one per metric) to the
devcluster's real Prometheus (scraping every exporter at the real 15 s interval), everything
fetched and decoded with garbage collection paused as in the gate. The gate adds parsing the
reports, merging in the metrics, the policy and the speed tiers. It also prints the gate's own
CPU per node (this process's CPU time; the devcluster runs in a child process) and, between the
two sizes, how that grows (linear: within ``LINEAR`` of the smaller size's).

``probe_publish``: 10 simulated minutes of the node probe (one report a minute, as
deploy/node-probe.yaml runs it) on 4,096 nodes with steady telemetry, through the production
``Publisher``, against the scheme it replaced (the full report as a node annotation, written
whenever the report's content changed or every 30 s). Counts node writes per node per hour and
the bytes of node objects written (what every node watcher receives), for both.

Each line: ``bench <name>: <figures> ratio=<r> target<=<t> PASS|FAIL``, with the load average;
exits 1 when one misses. The servers log to files.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, config
from results import record
from trainops_devcluster import topology
from trainops_devcluster.cluster import DevCluster
from trainops_devcluster.hardware import NodeProfile
from trainops_devcluster.probe_daemon import ProbeDaemon
from trainops_devcluster.prometheus import REAL_SCRAPE_INTERVAL_S
from trainops_devcluster.store import Store
from trainops_devcluster.telemetry import NodeTelemetry

from trainops.conventions import HEALTH_NAMESPACE
from trainops.health.gate import GateConfig, gc_paused, list_paginated, run_gate
from trainops.health.policy import DEFAULT_POLICY, evaluate, load_policy
from trainops.health.probe import gpu_healthy_condition, replace_condition
from trainops.health.prometheus import PrometheusClient
from trainops.health.published import REPORT_SELECTOR
from trainops.kube.retry import Deadline

# 16,384 nodes do not fit a 24 GiB machine: at 4,096 Prometheus holds 4.2 GiB, the gate's process
# 2 GiB and the devcluster 0.9 GiB, all growing linearly (about 28 GiB at 16,384).
SIZES = (1024, 4096)  # the sizes the README quotes
LARGE_SIZES = (8192,)  # with BENCH_LARGE=1
LARGE = os.environ.get("BENCH_LARGE", "") not in ("", "0")
PAGE_SIZE = 500
ROUNDS = 3
TARGET = 1.2
LINEAR = 1.3
PUBLISH_NODES = 4096
PUBLISH_SAMPLE = int(
    os.environ.get("BENCH_PUBLISH_SAMPLE", 256)
)  # nodes simulated; BENCH_PUBLISH_SAMPLE=4096 for all
GPUS = 8
PUBLISH_MINUTES = 10
PUBLISH_TARGET = 10.0  # at least this many times fewer bytes on node objects
OLD_HEARTBEAT_S = 30.0
OLD_ANNOTATION = "trainops.io/health-report"


def load() -> str:
    return "load=" + "/".join(f"{x:.1f}" for x in os.getloadavg())


class RecordingPrometheus(PrometheusClient):
    """A Prometheus client that remembers the queries it was asked, so the floor can send the same."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        self.asked.append(promql)
        return super().query(promql, at=at)


def floor(core_v1, prometheus: PrometheusClient, config: GateConfig, queries: list[str]) -> int:
    """The gate's reads done as the gate does them (see the module docstring); returns the items read."""
    deadline, now = Deadline(600), time.time()
    lister = functools.partial(core_v1.list_namespaced_config_map, HEALTH_NAMESPACE)
    with gc_paused(), ThreadPoolExecutor(1) as pool:
        series = pool.submit(lambda: sum(len(prometheus.query(promql, at=now)) for promql in queries))
        nodes = list_paginated(core_v1.list_node, config.selector, config.page_size, deadline, "nodes")
        reports = list_paginated(lister, REPORT_SELECTOR, config.page_size, deadline, "reports")
        return len(nodes) + len(reports) + series.result()


def serve_devcluster(nodes: int) -> None:
    """``--serve N``: a devcluster of N nodes in this process, ready (every report published, every
    exporter scraped twice); prints its kubeconfig and Prometheus URL as JSON, runs until stdin closes."""
    with DevCluster(
        nodes=nodes,
        inference=[],
        probe_interval_s=3600,
        prometheus=True,
        scrape_interval_s=REAL_SCRAPE_INTERVAL_S,
    ) as cluster:
        cluster.probe_daemon.wait_rounds(1, timeout=3600)  # every node has published its report
        cluster.wait_until_scraped(timeout=3600)  # twice: increase() needs two samples
        cluster.wait_until_scraped(timeout=3600)
        print(
            json.dumps({"kubeconfig": str(cluster.kubeconfig), "prometheus": cluster.prometheus_url}),
            flush=True,
        )
        sys.stdin.read()


def bench_gate(nodes: int) -> tuple[bool, float]:
    """One fleet size, its devcluster in a child process (so this process's CPU time is the gate's
    own, its Prometheus thread included); returns (passed, the gate's CPU seconds per node)."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(nodes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(server.stdout.readline() or "{}")
        if not ready:
            raise RuntimeError(f"the {nodes}-node devcluster did not start (exit {server.wait()})")
        api_client = config.new_client_from_config(config_file=ready["kubeconfig"])
        core_v1 = client.CoreV1Api(api_client)
        prometheus = RecordingPrometheus(ready["prometheus"], timeout=600)
        # Reports are published once, at setup; on a busy machine setup plus the rounds outlast the
        # policy's 300 s staleness bound, which would make every node unknown (and the gate cheaper).
        fresh = load_policy({"report_age": {"threshold": 24 * 3600}})
        gate_config = GateConfig(min_nodes=nodes // 2, page_size=PAGE_SIZE, policy=fresh, api_deadline_s=600)
        run_gate(core_v1, gate_config, prometheus=prometheus)  # warms both sides, records the queries
        queries, floors, gates, cpu, chosen = list(prometheus.asked), [], [], [], 0
        for _ in range(ROUNDS):
            start = time.perf_counter()
            floor(core_v1, prometheus, gate_config, queries)
            floors.append(time.perf_counter() - start)
            start, start_cpu = time.perf_counter(), time.process_time()
            result = run_gate(core_v1, gate_config, prometheus=prometheus)
            gates.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            chosen = len(result.selected)
        api_client.close()
    finally:
        server.stdin.close()
        server.wait(timeout=600)
    ratio = min(gates) / min(floors)
    per_node = min(cpu) / nodes
    passed = ratio <= TARGET and chosen >= nodes // 2
    print(
        f"bench health_gate: nodes={nodes} chosen={chosen} gate={min(gates):.2f}s floor={min(floors):.2f}s "
        f"(same {len(queries)} PromQL queries, concurrent, GC paused) "
        f"gate_cpu_per_node={per_node * 1e3:.3f}ms ratio={ratio:.2f} target<={TARGET} "
        f"{'PASS' if passed else 'FAIL'} ({load()})",
        flush=True,
    )
    record(
        "health_gate",
        passed=passed,
        ratio=round(ratio, 3),
        target=f"<={TARGET}",
        nodes=nodes,
        chosen=chosen,
        gate_s=round(min(gates), 3),
        floor_s=round(min(floors), 3),
        gate_cpu_per_node_ms=round(per_node * 1e3, 3),
        load=os.getloadavg()[0],
    )
    return passed, per_node


def bench_publish(sample: int = PUBLISH_SAMPLE, minutes: int = PUBLISH_MINUTES) -> bool:
    """The probe's writes over ``minutes`` simulated minutes after a first round, new scheme against
    the old. ``sample`` nodes are simulated; each node's probe is independent of the others, so the
    fleet's bytes are the sample's times ``PUBLISH_NODES / sample``."""
    store = Store()  # the store alone: no server, no controllers, no probe timer
    store.create("namespaces", topology.namespace(HEALTH_NAMESPACE))
    clock = SimulatedClock(time.time())
    telemetry = {}
    for index in range(sample):
        store.create("nodes", topology.gpu_node(index, NodeProfile(gpus=GPUS)))
        name = topology.node_name(index)
        telemetry[name] = NodeTelemetry.healthy(name, GPUS, seed=index, clock=clock)
    daemon = ProbeDaemon(store, telemetry)
    old = {name: OldScheme(store.get("nodes", "", name)) for name in telemetry}
    counted = {"nodes": [0, 0], "configmaps": [0, 0]}  # writes, bytes

    def count(event) -> None:
        if event.resource in counted:
            counted[event.resource][0] += 1
            counted[event.resource][1] += len(json.dumps(event.object, separators=(",", ":")))

    for minute in range(minutes + 1):  # minute 0: every probe's first publication, not counted
        if minute == 1:
            store.add_listener(count)
            for scheme in old.values():
                scheme.writes = scheme.bytes = 0
        for name in telemetry:
            daemon.probe(name, now=clock.now)
            old[name].publish(daemon.last_report(name))
        clock.now += 60.0
    scale, hours = PUBLISH_NODES / sample, minutes / 60.0
    node_writes, node_bytes = counted["nodes"][0] / sample / hours, counted["nodes"][1] * scale
    old_writes = sum(o.writes for o in old.values()) / sample / hours
    old_bytes = sum(o.bytes for o in old.values()) * scale
    ratio = old_bytes / max(node_bytes, 1)
    passed = ratio >= PUBLISH_TARGET
    print(
        f"bench probe_publish: nodes={PUBLISH_NODES} (simulated {sample}) minutes={minutes} "
        f"node_writes_per_node_hour={node_writes:.1f} (old {old_writes:.1f}) "
        f"node_object_bytes={node_bytes / 1e6:.2f}MB (old {old_bytes / 1e6:.1f}MB) "
        f"report_configmap_writes_per_node_hour={counted['configmaps'][0] / sample / hours:.1f} "
        f"({counted['configmaps'][1] * scale / 1e6:.1f}MB, read by trainops only) "
        f"ratio(old/new node bytes)={ratio:.1f} target>={PUBLISH_TARGET} {'PASS' if passed else 'FAIL'} ({load()})",
        flush=True,
    )
    record(
        "probe_publish",
        passed=passed,
        ratio=round(ratio, 2),
        target=f">={PUBLISH_TARGET:g}",
        nodes=PUBLISH_NODES,
        simulated=sample,
        node_writes_per_node_hour=round(node_writes, 1),
        old_node_writes_per_node_hour=round(old_writes, 1),
        node_object_mb=round(node_bytes / 1e6, 2),
        old_node_object_mb=round(old_bytes / 1e6, 1),
    )
    return passed


class SimulatedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class OldScheme:
    """The scheme replaced in issue 17, on the same reports: the report as a node annotation (and the
    condition in status), two node writes whenever the content changed or every ``OLD_HEARTBEAT_S``.
    Counts the node object each write leaves (what every node watcher receives)."""

    def __init__(self, node: dict) -> None:
        self.node, self.content, self.at, self.writes, self.bytes = node, None, float("-inf"), 0, 0

    def publish(self, report) -> None:
        content = {**report.to_dict(), "collected_at": None}
        if content == self.content and report.collected_at - self.at < OLD_HEARTBEAT_S:
            return
        condition = gpu_healthy_condition(evaluate(report, DEFAULT_POLICY, now=report.collected_at))
        self.node["metadata"].setdefault("annotations", {})[OLD_ANNOTATION] = report.to_json()
        status = self.node.setdefault("status", {})
        status["conditions"] = replace_condition(status.get("conditions") or [], condition)
        self.writes += 2
        self.bytes += 2 * len(json.dumps(self.node, separators=(",", ":")))
        self.content, self.at = content, report.collected_at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = [*SIZES, *LARGE_SIZES] if LARGE else list(SIZES)
    parser.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=sizes,
        help=f"gate fleet sizes (default {sizes}; BENCH_LARGE=1 adds {list(LARGE_SIZES)})",
    )
    parser.add_argument("--skip-gate", action="store_true", help="only the publishing benchmark")
    parser.add_argument("--skip-publish", action="store_true", help="only the gate benchmark")
    parser.add_argument("--serve", type=int, metavar="N", help=argparse.SUPPRESS)  # bench_gate's child
    args = parser.parse_args()
    if args.serve:
        serve_devcluster(args.serve)
        return 0
    passed = True
    if not args.skip_publish:
        passed &= bench_publish()
    if not args.skip_gate:
        per_node = {}
        for nodes in sorted(args.nodes):
            ok, per_node[nodes] = bench_gate(nodes)
            passed &= ok
        if len(per_node) > 1:
            small, large = min(per_node), max(per_node)
            growth = per_node[large] / per_node[small]
            linear = growth <= LINEAR
            passed &= linear
            print(
                f"bench health_gate_linear: cpu_per_node {large}/{small} nodes ratio={growth:.2f} "
                f"target<={LINEAR} {'PASS' if linear else 'FAIL'} ({load()})"
            )
            record(
                "health_gate_linear",
                passed=linear,
                ratio=round(growth, 3),
                target=f"<={LINEAR}",
                small_nodes=small,
                large_nodes=large,
            )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
