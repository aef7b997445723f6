"""``NodeHealthGateOperator``: choose healthy GPU nodes for a run, quarantining the failing ones.

Thin: the gate is ``trainops.health.gate`` (reads, policy, speed tiers) and ``trainops.health.quarantine``.

    gate = NodeHealthGateOperator(task_id="health_gate", min_nodes=8, prometheus_conn_id="prometheus",
                                  policy_overrides={"xid_warn": {"verdict": "exclude"}}, wait_timeout_s=1800)
    claim = ClaimNodesOperator(task_id="claim_nodes", count=8,
                               node_names="{{ ti.xcom_pull(task_ids='health_gate')['node_names'] }}", ...)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from trainops.hooks.health_gate import GateSpec
from trainops.provider.errors import translate_errors
from trainops.triggers.health import HealthGateTrigger

from trainops.errors import TemporaryError
from trainops.health.gate import DEFAULT_SELECTOR, GateResult


class NodeHealthGateOperator(BaseOperator):
    """Evaluate the candidate nodes, quarantine failing ones, and return the chosen nodes.

    :param selector: label selector of the candidate nodes. Templated.
    :param min_nodes: how many healthy nodes the run needs. Templated.
    :param gpus_per_node: allocatable GPUs each chosen node must have (None: no requirement); when no
        candidate has that many, or fewer nodes than ``min_nodes`` exist, the task fails at once. Templated.
    :param policy_overrides: policy rows to change, ``{row: {threshold|verdict|if_unknown: value}}``;
        an unknown row or field fails the task before anything is changed. Templated.
    :param prometheus_conn_id: ``http`` connection of a Prometheus with dcgm-exporter metrics (optional).
    :param on_prometheus_unavailable: ``fail`` (default) or ``probe-only`` (gate on the probe reports alone).
    :param fabrics: the cluster's RDMA fabrics, ``{name: {required, link_layer, hcas, rate_gbps, ports}}``
        over the built-in ``default`` (InfiniBand ports if the node has any, else RoCE, at the rate of its
        fastest) and ``none`` (a pool that needs no RDMA); a node's ``fabric_label`` picks one. ``hcas`` is
        an ``NCCL_IB_HCA`` list. Templated.
    :param fabric_label: the node label naming a node's fabric (default ``trainops.io/fabric``). Templated.
    :param fault_window_s: how long a burst fault read from Prometheus (XIDs) or a slowdown seen in
        training keeps a node out after it was last seen (default 7200). Templated.
    :param speed_tiers: give the run nodes of like measured speed (the probe's GEMM speeds; nodes of
        unknown speed form a group of their own, never left out for it). Templated.
    :param topology: where in the fabric the run must fit, ``{"mode": "none"|"preferred"|"required",
        "level": <node label>, "levels": [...]}`` (``trainops.placement``): with ``required`` the healthy nodes
        must hold ``min_nodes - spares`` in one domain of the level, else the gate waits as for too few
        nodes, naming the largest domains. None: no topology. Templated.
    :param spares: how many of ``min_nodes`` are spares, which may sit outside that domain. Templated.
    :param resume_min_nodes: the training task's ``min_nodes`` (the fewest nodes it may resume on), checked
        here to be from 1 to ``min_nodes - spares`` so that a bad one fails before the gate writes anything;
        None: not checked. Templated.
    :param gpu_memory_gib: the run's peak memory per GPU in GiB on all its nodes, when known (None: not
        checked): when the worst case on ``resume_min_nodes`` (the peak grown by nodes / resume_min_nodes, as
        FSDP shards grow) exceeds the smallest chosen GPU (GFD's ``nvidia.com/gpu.memory``), the gate warns,
        naming the smallest safe ``min_nodes``. Templated.
    :param wait_timeout_s: with too few healthy nodes, wait (deferred, no worker slot) up to this many
        seconds for enough, then fail naming what is missing; 0 fails at once.
    :param poll_interval_s: how often the deferred wait re-evaluates.
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster.
    :param api_deadline_s: seconds each quarantine write may keep retrying conflicts and 429/5xx answers.

    XCom (return value): ``{"node_names": [chosen], "verdicts": [{"name", "verdict", "reasons"}],
    "quarantined": [candidates carrying the quarantine], "tier": [slowest, fastest] | None, "warnings": [...],
    "placement": where the run would go (with a topology) | None}``.
    """

    template_fields: Sequence[str] = (
        "selector",
        "min_nodes",
        "gpus_per_node",
        "policy_overrides",
        "prometheus_conn_id",
        "on_prometheus_unavailable",
        "speed_tiers",
        "fabrics",
        "fabric_label",
        "fault_window_s",
        "wait_timeout_s",
        "poll_interval_s",
        "topology",
        "spares",
        "resume_min_nodes",
        "gpu_memory_gib",
    )
    ui_color = "#f4d6a0"

    def __init__(
        self,
        *,
        selector: str = DEFAULT_SELECTOR,
        min_nodes: int = 1,
        gpus_per_node: int | None = None,
        policy_overrides: dict[str, dict[str, Any]] | None = None,
        prometheus_conn_id: str | None = None,
        on_prometheus_unavailable: str = "fail",
        speed_tiers: bool = True,
        fabrics: dict[str, dict[str, Any]] | None = None,
        fabric_label: str | None = None,
        fault_window_s: float | None = None,
        topology: dict[str, Any] | None = None,
        spares: int = 0,
        resume_min_nodes: int | None = None,
        gpu_memory_gib: float | None = None,
        wait_timeout_s: float = 0,
        poll_interval_s: float = 30,
        kubernetes_conn_id: str = "kubernetes_default",
        api_deadline_s: float = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.selector, self.min_nodes, self.policy_overrides = selector, min_nodes, policy_overrides or {}
        self.gpus_per_node = gpus_per_node
        self.prometheus_conn_id, self.on_prometheus_unavailable = (
            prometheus_conn_id,
            on_prometheus_unavailable,
        )
        self.speed_tiers, self.kubernetes_conn_id = speed_tiers, kubernetes_conn_id
        self.fabrics, self.fabric_label, self.fault_window_s = fabrics, fabric_label, fault_window_s
        self.topology, self.spares, self.resume_min_nodes = topology, spares, resume_min_nodes
        self.gpu_memory_gib = gpu_memory_gib
        self.wait_timeout_s, self.poll_interval_s, self.api_deadline_s = (
            wait_timeout_s,
            poll_interval_s,
            api_deadline_s,
        )

    def _spec(self) -> GateSpec:
        if float(self.wait_timeout_s) < 0 or float(self.poll_interval_s) <= 0:
            raise ValueError(
                f"wait_timeout_s must be >= 0 and poll_interval_s > 0, got {self.wait_timeout_s}, {self.poll_interval_s}"
            )
        spec = GateSpec(
            kubernetes_conn_id=self.kubernetes_conn_id,
            selector=self.selector,
            min_nodes=self.min_nodes,
            gpus_per_node=self.gpus_per_node,
            policy_overrides=self.policy_overrides or {},
            speed_tiers=self.speed_tiers,
            prometheus_conn_id=self.prometheus_conn_id,
            on_prometheus_unavailable=self.on_prometheus_unavailable,
            fabrics=self.fabrics or None,
            fabric_label=self.fabric_label or None,
            fault_window_s=self.fault_window_s,
            topology=dict(self.topology) if self.topology else None,
            spares=int(self.spares),
            resume_min_nodes=self.resume_min_nodes,
            gpu_memory_gib=self.gpu_memory_gib,
        )
        spec.config()  # bad input fails here, before anything is changed
        return spec

    @translate_errors
    def execute(self, context: Any) -> dict[str, Any]:
        spec = self._spec()
        waits = float(self.wait_timeout_s) > 0
        return self._gate(context, spec, time.time() + float(self.wait_timeout_s), may_wait=waits)

    @translate_errors
    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] == "timeout":
            raise TemporaryError(f"health gate: not enough healthy nodes by the deadline: {event['message']}")
        if event["status"] != "ready":
            raise TemporaryError(f"health gate failed: {event.get('message')}")
        deadline = event["deadline"]
        return self._gate(context, self._spec(), deadline, may_wait=time.time() < deadline)

    def _gate(self, context: Any, spec: GateSpec, deadline: float, may_wait: bool) -> dict[str, Any]:
        """Evaluate, quarantine, and return the XCom; defer when too few pass and it may wait."""
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        from trainops.health.quarantine import apply_quarantine
        from trainops.kube.retry import Deadline

        core_v1 = KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube().core
        result = spec.evaluate(core_v1)
        quarantined = apply_quarantine(core_v1, result, Deadline(self.api_deadline_s))
        self.log.info("health gate:\n%s", result.table())
        if quarantined:
            self.log.warning("quarantined now: %s", ", ".join(quarantined))
        if result.enough:
            return _xcom(result, quarantined)
        if not may_wait:
            raise TemporaryError(f"health gate: {result.missing()}")
        self.log.info("too few healthy nodes; waiting (deferred) until %s", time.ctime(deadline))
        self.defer(
            trigger=HealthGateTrigger(spec.to_dict(), deadline, float(self.poll_interval_s)),
            method_name="execute_complete",
        )


def _xcom(result: GateResult, quarantined_now: list[str]) -> dict[str, Any]:
    held = [n.name for n in result.nodes if n.quarantined or n.name in quarantined_now]
    return {
        "node_names": result.selected,
        "verdicts": result.to_dict()["nodes"],
        "quarantined": held,
        "tier": result.to_dict()["tier"],
        "warnings": result.warnings,
        "placement": result.placement.to_dict() if result.placement else None,
    }
