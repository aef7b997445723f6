"""Benchmark: the health gate over 4,096 devcluster nodes against the floor of reading its inputs.

The floor is what any gate must at least do: one paginated list of the candidate nodes (with
their published reports) plus one query per dcgm-exporter metric to the devcluster's real
Prometheus (scraping every node's exporter at the real 15 s interval), fetched and decoded.
The gate adds parsing the reports, merging in the metrics, the policy, stragglers and tiers.
Both run against the same devcluster in the same process, alternately; the best of each counts.
Prints ``bench health_gate: ... ratio=<gate/floor> target<=1.5 PASS|FAIL``; exits 1 on FAIL.
"""

from __future__ import annotations

import sys
import time

from kubernetes import client, config
from trainops_devcluster.cluster import DevCluster
from trainops_devcluster.prometheus import REAL_SCRAPE_INTERVAL_S

from trainops.health.gate import GateConfig, list_nodes_paginated, run_gate
from trainops.health.policy import load_policy
from trainops.health.prometheus import GAUGES, XID_COUNT, XID_LAST, PrometheusClient
from trainops.kube.retry import Deadline

NODES = 4096
PAGE_SIZE = 500
ROUNDS = 3
TARGET = 1.5


def floor(core_v1, prometheus: PrometheusClient) -> int:
    nodes = list_nodes_paginated(core_v1, "", PAGE_SIZE, Deadline(600))
    series = sum(len(prometheus.query(metric)) for metric in [*GAUGES, XID_LAST, XID_COUNT])
    return len(nodes) + series


def main() -> int:
    with DevCluster(
        nodes=NODES,
        inference=[],
        probe_interval_s=3600,
        prometheus=True,
        scrape_interval_s=REAL_SCRAPE_INTERVAL_S,
    ) as cluster:
        cluster.probe_daemon.wait_rounds(1, timeout=1800)  # every node has published its report
        cluster.wait_until_scraped(timeout=1800)  # twice: increase() needs two samples
        cluster.wait_until_scraped(timeout=1800)
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core_v1 = client.CoreV1Api(api_client)
        prometheus = PrometheusClient(cluster.prometheus_url, timeout=600)
        # Reports are published once, at setup; on a busy machine setup plus the rounds outlast the
        # policy's 300 s staleness bound, which would make every node unknown (and the gate cheaper).
        fresh = load_policy({"report_age": {"threshold": 24 * 3600}})
        gate_config = GateConfig(min_nodes=NODES // 2, page_size=PAGE_SIZE, policy=fresh)
        floors, gates, chosen = [], [], 0
        for _ in range(ROUNDS):
            start = time.perf_counter()
            floor(core_v1, prometheus)
            floors.append(time.perf_counter() - start)
            start = time.perf_counter()
            result = run_gate(core_v1, gate_config, prometheus=prometheus)
            gates.append(time.perf_counter() - start)
            chosen = len(result.selected)
        api_client.close()
    ratio = min(gates) / min(floors)
    verdict = "PASS" if ratio <= TARGET and chosen >= NODES // 2 else "FAIL"
    print(
        f"bench health_gate: nodes={NODES} chosen={chosen} gate={min(gates):.2f}s floor={min(floors):.2f}s "
        f"ratio={ratio:.2f} target<={TARGET} {verdict}"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
