"""The memory risk of an elastic resume, named at the gate.

A run sized for ``nodes`` nodes that resumes on ``min_nodes`` shards its model state over fewer GPUs:
with FSDP (or ZeRO-3) every GPU then holds ``nodes / min_nodes`` times its share of the parameters,
gradients and optimizer state. When the user states the run's peak memory per GPU on all its nodes
(``gpu_memory_gib``), the gate compares the worst case, that whole peak grown by ``nodes / min_nodes``
(activations do not grow, so this is an upper bound), with the memory of the smallest GPU it chose,
read from GPU Feature Discovery's ``nvidia.com/gpu.memory`` label (MiB per GPU; under the ``single``
MIG strategy, per MIG device: NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery). It warns, naming
the smallest safe ``min_nodes``; it refuses nothing, since the bound is an upper one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # GFD: MiB per GPU (or per MIG device)
MAX_LABEL_CHARS = 9  # a label value is the node's to write: more digits than any GPU has is no reading


def gpu_memory_mib(node: dict) -> int | None:
    """The node's GPU memory in MiB from GFD's label; None when absent or not a plain positive integer."""
    value = ((node.get("metadata") or {}).get("labels") or {}).get(GPU_MEMORY_LABEL)
    if not isinstance(value, str) or not value.isdigit() or len(value) > MAX_LABEL_CHARS:
        return None
    return int(value) or None


@dataclass(frozen=True)
class MemoryFit:
    """A run of ``nodes`` nodes, peaking at ``gpu_memory_gib`` per GPU on all of them, that may resume on as
    few as ``min_nodes`` (``nodes``: not elastic)."""

    nodes: int
    min_nodes: int
    gpu_memory_gib: float

    def __post_init__(self) -> None:
        value = self.gpu_memory_gib
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ValueError(
                f"gpu_memory_gib must be the run's peak memory per GPU in GiB on all its nodes (a number > 0), "
                f"or empty when not known; got {value!r}"
            )

    def need_gib(self, nodes: int) -> float:
        """The worst-case peak per GPU on ``nodes`` nodes: the whole peak grown by ``self.nodes / nodes``."""
        return self.gpu_memory_gib * self.nodes / nodes

    def risk(self, chosen: list[dict]) -> str | None:
        """A warning naming the memory risk on the ``chosen`` nodes; None when there is none."""
        if not chosen:
            return None
        need = self.need_gib(self.min_nodes)
        sizes = (
            f"on min_nodes={self.min_nodes} of {self.nodes} nodes"
            if self.min_nodes < self.nodes
            else "on all its nodes"
        )
        known = {n["metadata"]["name"]: mib for n in chosen if (mib := gpu_memory_mib(n)) is not None}
        if len(known) < len(chosen):
            unlabelled = sorted({n["metadata"]["name"] for n in chosen} - set(known))
            return (
                f"GPU memory not checked: {', '.join(unlabelled[:5])} lack(s) the {GPU_MEMORY_LABEL} label (GPU "
                f"Feature Discovery writes it); the run may need up to {need:.0f} GiB per GPU {sizes}"
            )
        smallest = min(known, key=lambda name: (known[name], name))
        have = known[smallest] / 1024
        if need <= have:
            return None
        gpu = f"the {have:.0f} GiB of the smallest chosen GPU ({smallest}: {GPU_MEMORY_LABEL}={known[smallest]})"
        if self.gpu_memory_gib > have:
            return f"the run may not fit: gpu_memory_gib={self.gpu_memory_gib:g} is more than {gpu}"
        safe = math.ceil(self.gpu_memory_gib * self.nodes / have)
        return (
            f"an elastic resume may run out of GPU memory: {sizes} each GPU may need up to {need:.0f} GiB "
            f"(gpu_memory_gib={self.gpu_memory_gib:g} x {self.nodes}/{self.min_nodes}: sharded state grows by "
            f"nodes/min_nodes), more than {gpu}; set min_nodes >= {safe}, or lower the per-GPU peak"
        )
