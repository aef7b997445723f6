"""The checks, in the order they are printed."""

from __future__ import annotations

from trainops.doctor import access, admission, dcgm, gpu_operator, kueue, namespaces, node_probe, tolerations
from trainops.doctor.config import Check

CHECKS: tuple[Check, ...] = (
    Check(
        "gpu-operator",
        "GPU Operator version and state, CDI, its RuntimeClass and the probe's",
        gpu_operator.check,
    ),
    Check("node-probe", "the probe DaemonSet has a ready pod on every GPU node", node_probe.check_daemon_set),
    Check("probe-reports", "every GPU node's probe report is fresh", node_probe.check_reports),
    Check("dcgm-exporter", "dcgm-exporter series for every metric the gate reads, keyed by node", dcgm.check),
    Check("kueue", "Kueue serves a version trainops speaks, with its CRDs", kueue.check_api),
    Check(
        "kueue-queues",
        "the ClusterQueue, LocalQueue and priority class the lifecycle uses",
        kueue.check_queues,
    ),
    Check(
        "daemonset-tolerations", "DaemonSets on GPU nodes tolerate every trainops taint", tolerations.check
    ),
    Check("namespaces", "the namespaces and their Pod Security levels", namespaces.check),
    Check("probe-admission", "the probe's admission policies are present and bound", admission.check),
    Check("permissions", "this account may do what trainops does (SelfSubjectAccessReview)", access.check),
)
