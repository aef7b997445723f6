"""GPU nodes labelled for third-party GPU clients as GPU Operator v26.7.0 and later label them.

deploy/node-probe.yaml selects nodes by ``nvidia.com/gpu.deploy.client=true`` (so GPU Operator's
driver manager moves the probe off a node before unloading its driver); the devcluster seeds a
GPU Operator v25.10.0 cluster, whose nodes lack it, so tests that run the manifest there label the
GPU nodes first, as the manifest tells users of older operators to."""

from __future__ import annotations

from trainops.doctor.gpu_operator import CLIENT_LABEL


def label_gpu_clients(cluster, value: str = "true", nodes: list[str] | None = None) -> list[str]:
    """Set ``CLIENT_LABEL`` on ``nodes`` (default: every node labelled ``nvidia.com/gpu.present=true``);
    the names labelled."""
    if nodes is None:
        nodes = sorted(
            n["metadata"]["name"]
            for n in cluster.store.list("nodes")[0]
            if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"
        )
    for name in nodes:
        cluster.store.mutate(
            "nodes", "", name, lambda n: n["metadata"].setdefault("labels", {}).update({CLIENT_LABEL: value})
        )
    return nodes
