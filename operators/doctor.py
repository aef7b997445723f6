"""``ClusterDoctorOperator``: ``trainops doctor`` as a task, the lifecycle's optional ``preflight``.

Thin: the checks are ``trainops.doctor``.  Read-only; off (``enabled=False``) it succeeds at once and
reads nothing, so a DAG can keep it at its head and a trigger-form param turn it on.

    preflight = ClusterDoctorOperator(task_id="preflight", enabled="{{ params.preflight }}",
                                      prometheus_conn_id="prometheus")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from trainops.provider.errors import translate_errors

from trainops.errors import PermanentError, TemporaryError
from trainops.health.gate import DEFAULT_SELECTOR


class ClusterNotReady(PermanentError):
    """The doctor found problems: a retry would find them again until someone fixes them."""


class ClusterDoctorOperator(BaseOperator):
    """Check that the cluster is set up for trainops; fail naming each problem and its fix.

    :param enabled: run the checks; False succeeds at once without reading the cluster. Templated.
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster (its account's
        permissions are the ones checked: deploy/doctor-rbac.yaml grants the reads the checks need).
    :param prometheus_conn_id: ``trainops_prometheus`` connection of the Prometheus that scrapes
        dcgm-exporter (None: its check is skipped). Templated.
    :param selector: label selector of the GPU nodes. Templated.
    :param training_namespace: where runs train. Templated.
    :param cluster_queue: the training ClusterQueue. Templated.
    :param local_queue: the LocalQueue runs submit to. Templated.
    :param priority_class: the WorkloadPriorityClass runs name. Templated.
    :param probe_daemon_set: ``<namespace>/<name>`` of the node probe's DaemonSet.
    :param account: whose permissions to ask for (``worker``, ``triggerer`` or ``api-server``).
    :param check_deadline_s: how long each check may take.

    XCom (return value): the report as ``trainops doctor --json`` prints it (None when off).  Problems fail
    the task without a retry; a check that could not finish (the API or Prometheus too slow) fails
    only this try.
    """

    template_fields: Sequence[str] = (
        "enabled",
        "prometheus_conn_id",
        "selector",
        "training_namespace",
        "cluster_queue",
        "local_queue",
        "priority_class",
    )
    ui_color = "#d8e8c8"

    def __init__(
        self,
        *,
        enabled: bool | str = True,
        kubernetes_conn_id: str = "kubernetes_default",
        prometheus_conn_id: str | None = None,
        selector: str = DEFAULT_SELECTOR,
        training_namespace: str = "training",
        cluster_queue: str = "training",
        local_queue: str = "training",
        priority_class: str = "training-standard",
        probe_daemon_set: str = "kube-system/trainops-node-probe",
        account: str = "worker",
        check_deadline_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.enabled, self.kubernetes_conn_id, self.prometheus_conn_id = (
            enabled,
            kubernetes_conn_id,
            prometheus_conn_id,
        )
        self.selector, self.training_namespace = selector, training_namespace
        self.cluster_queue, self.local_queue, self.priority_class = cluster_queue, local_queue, priority_class
        self.probe_daemon_set, self.account, self.check_deadline_s = (
            probe_daemon_set,
            account,
            check_deadline_s,
        )

    @translate_errors
    def execute(self, context: Any) -> dict | None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be true or false, got {self.enabled!r}")
        if not self.enabled:
            self.log.info("preflight is off (enabled=False): the cluster is not checked")
            return None
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook
        from trainops.hooks.prometheus import PrometheusHook

        from trainops.doctor import DoctorConfig, run_doctor
        from trainops.doctor.result import PROBLEM

        config = DoctorConfig(
            selector=self.selector,
            training_namespace=self.training_namespace,
            cluster_queue=self.cluster_queue,
            local_queue=self.local_queue,
            priority_class=self.priority_class,
            probe_daemon_set=self.probe_daemon_set,
            prometheus=PrometheusHook(self.prometheus_conn_id).client() if self.prometheus_conn_id else None,
            account=self.account,
            check_deadline_s=self.check_deadline_s,
        )
        report = run_doctor(KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube(), config)
        for line in report.text().splitlines():
            self.log.info("%s", line)
        if report.exit_code == 0:
            return report.to_dict()
        problems = [
            f"{f.check}: {p.what} (fix: {p.fix})"
            for f in report.findings
            if f.status != "ok"
            for p in f.problems
        ]
        message = f"trainops doctor: {len(problems)} problem(s): " + "; ".join(problems[:5])
        if any(f.status == PROBLEM for f in report.findings):
            raise ClusterNotReady(message)
        raise TemporaryError(message)  # only checks that could not finish: the next try may
