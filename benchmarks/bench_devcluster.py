"""devcluster at scale: 4,096 nodes x 8 GPUs running 32,768 pods.

The server runs in a child process (so its peak memory is its own); this process is the client.
It measures listing every node with ``limit=500`` pagination against one unpaginated list, both
with the official ``kubernetes`` client over HTTP, in the same run.
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

from results import record

NODES = 4096
GPUS = 8
SYSTEM_NODES = 2  # untainted CPU nodes beside the GPU pool, as the devcluster boots by default
PODS = NODES * GPUS
PAGE = 500
REPEATS = 3
TARGET_RATIO = 1.5


PROBE_INTERVAL_S = 60.0  # the node probe DaemonSet's interval (deploy/node-probe.yaml), not the tests' 1 s


def bench_pod(index: int, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bench-{index:05d}", "namespace": "default", "labels": {"app": "bench"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "bench", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def serve(kubeconfig: str, ready, done, peak) -> None:
    """Child process: a 4,096-node devcluster with 32,768 running pods, served until ``done``."""
    from trainops_devcluster import topology
    from trainops_devcluster.cluster import DevCluster

    with DevCluster(
        NODES,
        GPUS,
        inference=[],
        kubeconfig=Path(kubeconfig),
        probe_interval_s=PROBE_INTERVAL_S,
        system_nodes=SYSTEM_NODES,
    ) as cluster:
        for index in range(PODS):
            cluster.store.create("pods", bench_pod(index, topology.node_name(index // GPUS)))
        ready.set()
        done.wait()
    peak.value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def list_all_nodes(core, limit: int | None) -> int:
    count, token = 0, None
    while True:
        page = core.list_node(limit=limit, _continue=token) if limit else core.list_node()
        count += len(page.items)
        token = page.metadata._continue
        if not limit or not token:
            return count


def timed(fn) -> float:
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    import tempfile

    from kubernetes import client, config

    context = multiprocessing.get_context("spawn")
    ready, done, peak = context.Event(), context.Event(), context.Value("d", 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = f"{tmp}/kubeconfig"
        server = context.Process(target=serve, args=(kubeconfig, ready, done, peak))
        started = time.perf_counter()
        server.start()
        if not ready.wait(timeout=900):
            print("bench devcluster_list_nodes: the devcluster did not come up FAIL")
            record("devcluster_list_nodes", passed=False, error="the devcluster did not come up")
            server.kill()
            return 1
        boot = time.perf_counter() - started
        try:  # the server child waits for `done`: set it whatever happens here, or this never exits
            core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
            assert list_all_nodes(core, PAGE) == NODES + SYSTEM_NODES
            pods = len(core.list_pod_for_all_namespaces(limit=PAGE).items)
            unpaginated = timed(lambda: list_all_nodes(core, None))
            paginated = timed(lambda: list_all_nodes(core, PAGE))
        finally:
            done.set()
            server.join(timeout=60)

    ratio = paginated / unpaginated
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(
        f"bench devcluster_list_nodes: nodes={NODES}+{SYSTEM_NODES} system gpus={NODES * GPUS} pods={PODS} (first page {pods}) "
        f"paginated(limit={PAGE})={paginated:.3f}s unpaginated={unpaginated:.3f}s "
        f"ratio={ratio:.2f} target<={TARGET_RATIO} {verdict}"
    )
    record(
        "devcluster_list_nodes",
        passed=verdict == "PASS",
        ratio=round(ratio, 3),
        target=f"<={TARGET_RATIO}",
        nodes=NODES,
        pods=PODS,
        paginated_s=round(paginated, 3),
        unpaginated_s=round(unpaginated, 3),
    )
    print(
        f"bench devcluster_memory: server_peak_rss={peak.value:.0f}MiB startup_with_pods={boot:.1f}s (reported)"
    )
    record("devcluster_memory", server_peak_rss_mib=round(peak.value), startup_with_pods_s=round(boot, 1))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
