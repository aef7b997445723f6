"""``GpuHealthSensor`` and ``FabricHealthSensor``: wait until the GPU side (or the InfiniBand side) of
nodes passes the health policy: every named node, or at least ``min_healthy`` of the candidates.

They only read (no quarantine). With ``deferrable=True`` (default) they wait in the triggerer.
XCom: ``{"node_names": [passing nodes], "verdicts": [{"name", "verdict", "reasons"}]}``.

    GpuHealthSensor(task_id="gpus_ok", node_names=["gpu-node-001", "gpu-node-002"], timeout=1800)
    FabricHealthSensor(task_id="fabric_ok", min_healthy=16, poke_interval=30, timeout=3600)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout
from trainops.hooks.health_gate import GateSpec
from trainops.provider.errors import translate_errors
from trainops.triggers.health import HealthGateTrigger

from trainops.errors import TemporaryError
from trainops.health.gate import DEFAULT_SELECTOR, GateResult


class _SideHealthSensor(BaseSensorOperator):
    """Wait on one side of node health.

    :param node_names: nodes that must all pass (unless ``min_healthy``). Templated.
    :param selector: label selector of the candidates when ``node_names`` is empty. Templated.
    :param min_healthy: how many candidates must pass (default: all of ``node_names``). Templated.
    :param policy_overrides: policy row overrides (rows of the other side are ignored).
    :param prometheus_conn_id: ``http`` connection of Prometheus (optional). Templated.
    :param on_prometheus_unavailable: ``fail`` or ``probe-only``. Templated.
    :param fabrics: the cluster's RDMA fabrics (as ``NodeHealthGateOperator`` takes them). Templated.
    :param fabric_label: the node label naming a node's fabric (default ``trainops.io/fabric``). Templated.
    :param fault_window_s: how long a burst fault keeps a node out after it was last seen. Templated.
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster.
    :param deferrable: wait in the triggerer between checks instead of holding a worker slot (default).
    """

    side = "all"
    template_fields: Sequence[str] = (
        "node_names",
        "selector",
        "min_healthy",
        "policy_overrides",
        "prometheus_conn_id",
        "on_prometheus_unavailable",
        "fabrics",
        "fabric_label",
        "fault_window_s",
    )

    def __init__(
        self,
        *,
        node_names: Sequence[str] = (),
        selector: str = DEFAULT_SELECTOR,
        min_healthy: int | None = None,
        policy_overrides: dict[str, dict[str, Any]] | None = None,
        prometheus_conn_id: str | None = None,
        on_prometheus_unavailable: str = "fail",
        fabrics: dict[str, dict[str, Any]] | None = None,
        fabric_label: str | None = None,
        fault_window_s: float | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node_names, self.selector, self.min_healthy = node_names, selector, min_healthy
        self.policy_overrides = policy_overrides or {}
        self.prometheus_conn_id, self.on_prometheus_unavailable = (
            prometheus_conn_id,
            on_prometheus_unavailable,
        )
        self.kubernetes_conn_id, self.deferrable = kubernetes_conn_id, deferrable
        self.fabrics, self.fabric_label, self.fault_window_s = fabrics, fabric_label, fault_window_s

    def _spec(self) -> GateSpec:
        spec = GateSpec(
            kubernetes_conn_id=self.kubernetes_conn_id,
            selector=self.selector,
            node_names=list(self.node_names),
            min_nodes=self.min_healthy,
            policy_overrides=self.policy_overrides or {},
            side=self.side,
            speed_tiers=False,
            prometheus_conn_id=self.prometheus_conn_id,
            on_prometheus_unavailable=self.on_prometheus_unavailable,
            fabrics=self.fabrics or None,
            fabric_label=self.fabric_label or None,
            fault_window_s=self.fault_window_s,
        )
        spec.config()  # bad input fails here
        return spec

    def _check(self) -> GateResult:
        result = self._spec().evaluate()
        self.log.info("%s health:\n%s", self.side, result.table())
        return result

    @translate_errors
    def poke(self, context: Any) -> PokeReturnValue:
        result = self._check()
        return PokeReturnValue(is_done=result.enough, xcom_value=_xcom(result))

    @translate_errors
    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        return self._done_or_defer(time.time() + self.timeout)

    @translate_errors
    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] == "timeout":
            raise AirflowSensorTimeout(
                f"{self.side} health: timed out after {self.timeout}s: {event['message']}"
            )
        if event["status"] != "ready":
            raise TemporaryError(f"{self.side} health check failed: {event.get('message')}")
        # The XCom is this check's: nodes may have failed (or their reports aged) since the trigger's.
        return self._done_or_defer(event["deadline"])

    def _done_or_defer(self, deadline: float) -> dict[str, Any]:
        """The XCom when enough nodes pass now; else wait (deferred) for them until ``deadline``."""
        result = self._check()
        if result.enough:
            return _xcom(result)
        self.defer(
            trigger=HealthGateTrigger(self._spec().to_dict(), deadline, self.poke_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=max(deadline - time.time(), 0) + self.poke_interval + 60),
        )


def _xcom(result: GateResult) -> dict[str, Any]:
    return {"node_names": result.selection.node_names, "verdicts": result.to_dict()["nodes"]}


class GpuHealthSensor(_SideHealthSensor):
    """Wait until the nodes' GPUs pass: GPU count, XIDs, ECC, row remap, NVLink, thermal, PCIe, report age."""

    side = "gpu"


class FabricHealthSensor(_SideHealthSensor):
    """Wait until the nodes' InfiniBand ports pass: port count, state, link, rate, error rates, report age."""

    side = "fabric"
