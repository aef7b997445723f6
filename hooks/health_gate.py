"""The health gate through Airflow's connections: ``GateSpec``, the serializable description of one
check (connections, candidates, policy overrides, side) that the gate operator, the fabric sensor and
their trigger share; ``GateSpec.evaluate()`` runs the Airflow-free gate once (reads only)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainops.health.gate import DEFAULT_SELECTOR, GateConfig, GateResult, run_gate, side_policy
from trainops.health.memory import MemoryFit
from trainops.health.policy import load_policy
from trainops.placement.request import TopologyRequest

SIDES = ("all", "gpu", "fabric")


@dataclass
class GateSpec:
    """One health check. ``min_nodes`` None means every named node (``node_names`` required then).

    ``resume_min_nodes``: the training task's ``min_nodes`` (checked against the run's size);
    ``gpu_memory_gib``: the run's peak memory per GPU, when known (the gate names a memory risk)."""

    kubernetes_conn_id: str = "kubernetes_default"
    selector: str = DEFAULT_SELECTOR
    node_names: list[str] = field(default_factory=list)
    min_nodes: int | None = 1
    gpus_per_node: int | None = None
    policy_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    side: str = "all"
    speed_tiers: bool = True
    prometheus_conn_id: str | None = None
    on_prometheus_unavailable: str = "fail"
    fabrics: dict[str, dict[str, Any]] | None = None
    fabric_label: str | None = None
    fault_window_s: float | None = None
    topology: dict[str, Any] | None = None  # TopologyRequest.to_dict()
    spares: int = 0
    resume_min_nodes: int | None = None
    gpu_memory_gib: float | None = None

    def config(self) -> GateConfig:
        """The core's gate config; raises ValueError naming the bad field (an unknown policy row, ...)."""
        if self.side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)}, got {self.side!r}")
        if self.min_nodes is None and not self.node_names:
            raise ValueError(
                "give the nodes to check (node_names=[...]) or how many must pass (min_nodes / min_healthy)"
            )
        if not isinstance(self.policy_overrides, dict):
            raise ValueError(
                f"policy_overrides: expected a mapping {{row: {{field: value}}}}, got {self.policy_overrides!r}"
            )
        policy = load_policy(self.policy_overrides or None).with_settings(
            self.fabrics or None, self.fabric_label or None, _number("fault_window_s", self.fault_window_s)
        )
        return GateConfig(
            selector=self.selector,
            node_names=tuple(self.node_names),
            min_nodes=len(self.node_names) if self.min_nodes is None else self.min_nodes,
            gpus_per_node=self.gpus_per_node,
            policy=policy if self.side == "all" else side_policy(policy, self.side),
            speed_tiers=self.speed_tiers,
            on_unavailable=self.on_prometheus_unavailable,
            topology=TopologyRequest.from_value(self.topology),
            spares=self.spares,
            memory=self._memory(),
        )

    def _memory(self) -> MemoryFit | None:
        """The run's GPU memory need, for a run of ``min_nodes - spares`` nodes; checks ``resume_min_nodes``."""
        from trainops.training.spec import check_min_nodes

        if self.min_nodes is None:
            return None
        nodes = int(self.min_nodes) - int(self.spares)
        if self.resume_min_nodes is not None:
            check_min_nodes(self.resume_min_nodes, nodes)
        gib = _number("gpu_memory_gib", self.gpu_memory_gib)
        return None if gib is None else MemoryFit(nodes, self.resume_min_nodes or nodes, gib)

    def evaluate(self, core_v1: Any = None) -> GateResult:
        """Run the gate once through the Airflow connections (reads only); ``core_v1``: a client of the
        Kubernetes connection the caller already made (building one may run a kubeconfig exec plugin)."""
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook
        from trainops.hooks.prometheus import PrometheusHook

        config = self.config()
        prometheus = PrometheusHook(self.prometheus_conn_id).client() if self.prometheus_conn_id else None
        if core_v1 is None:
            core_v1 = KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube().core
        return run_gate(core_v1, config, prometheus=prometheus)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(name: str, value: Any) -> float | None:
    """A rendered template's number (``"7200"`` or ``7200.0``); None and empty stay None."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
