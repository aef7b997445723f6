"""GPU Operator: its version and state, CDI, and the RuntimeClass the node probe needs.

From the operator's ClusterPolicy (``nvidia.com/v1``) and the RuntimeClasses.  With CDI on (the
default from v25.10.0) the operator does not make ``nvidia`` the default runtime: only pods that
name its RuntimeClass get GPUs, so a probe DaemonSet without ``runtimeClassName`` sees no GPU.
A probe that names a RuntimeClass that does not exist gets no pod at all.
"""

from __future__ import annotations

import re

from trainops.doctor.reads import DAEMONSETS, Reads
from trainops.doctor.result import Outcome, Problem, Skip
from trainops.kube.client import Kind

GROUP, VERSION = "nvidia.com", "v1"
CLUSTER_POLICIES = Kind(GROUP, VERSION, "clusterpolicies", namespaced=False)
RUNTIME_CLASSES = Kind("node.k8s.io", "v1", "runtimeclasses", namespaced=False)
DEFAULT_RUNTIME_CLASS = "nvidia"  # the chart's operator.runtimeClass
CDI_DEFAULT_FROM = (25, 10)  # cdi.enabled defaults to true from v25.10.0
INSTALL = "helm upgrade --install gpu-operator nvidia/gpu-operator -n gpu-operator -f deploy/gpu-operator-values.yaml"


def operator_version(policy: dict) -> str | None:
    """The chart's app version on the ClusterPolicy's labels (``v25.10.0``), if any."""
    labels = (policy.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/version"):
        return labels["app.kubernetes.io/version"]
    chart = labels.get("helm.sh/chart") or ""
    return chart.removeprefix("gpu-operator-") if chart.startswith("gpu-operator-") else None


def cdi_enabled(policy: dict, version: str | None) -> bool:
    """``spec.cdi.enabled``; when unset, the operator's default for ``version``."""
    value = ((policy.get("spec") or {}).get("cdi") or {}).get("enabled")
    if isinstance(value, bool):
        return value
    found = re.match(r"v?(\d+)\.(\d+)", version or "")
    return bool(found) and (int(found[1]), int(found[2])) >= CDI_DEFAULT_FROM


def cluster_policy(reads: Reads) -> dict | None:
    """The ClusterPolicy in force (the operator ignores all but one); None when GPU Operator's CRD is absent."""

    def read() -> dict | None:
        if "clusterpolicies" not in (reads.served_resources(GROUP, VERSION) or set()):
            return None
        policies = reads.list(CLUSTER_POLICIES)
        live = [p for p in policies if (p.get("status") or {}).get("state") != "ignored"]
        return (live or policies or [{}])[0]

    return reads.shared("clusterpolicy", read)


def probe_daemon_set(reads: Reads, config) -> dict | None:
    namespace, name = config.probe
    return reads.shared("probe daemonset", lambda: reads.get(DAEMONSETS, name, namespace))


def check(reads: Reads, config) -> Outcome:
    policy = cluster_policy(reads)
    if policy is None:
        raise Skip(
            "GPU Operator is not installed (the API serves no nvidia.com/v1 ClusterPolicy); the driver, "
            "device plugin and dcgm-exporter are then yours: see daemonset-tolerations"
        )
    if not policy:
        return Outcome(
            "GPU Operator's CRD is installed but there is no ClusterPolicy",
            [Problem("no ClusterPolicy: the operator deploys nothing without one", INSTALL)],
        )
    problems = []
    name = policy["metadata"]["name"]
    version = operator_version(policy)
    status = policy.get("status") or {}
    state = status.get("state") or "unknown"
    if state != "ready":
        where = status.get("namespace") or "gpu-operator"
        problems.append(
            Problem(
                f"ClusterPolicy {name} is {state}: some of the driver, toolkit, device plugin or "
                "dcgm-exporter is not running",
                f"kubectl get pods -n {where} and fix the pods that are not Running",
            )
        )
    cdi = cdi_enabled(policy, version)
    runtime_class = ((policy.get("spec") or {}).get("operator") or {}).get(
        "runtimeClass"
    ) or DEFAULT_RUNTIME_CLASS
    classes = {rc["metadata"]["name"] for rc in reads.list(RUNTIME_CLASSES)}
    if runtime_class not in classes:
        problems.append(
            Problem(
                f"RuntimeClass {runtime_class} (ClusterPolicy spec.operator.runtimeClass) does not exist",
                "the operator's container toolkit creates it once it runs on a node: kubectl get pods -n "
                f"{status.get('namespace') or 'gpu-operator'} -l app=nvidia-container-toolkit-daemonset",
            )
        )
    probe = probe_daemon_set(reads, config)
    namespace, probe_name = config.probe
    used = (((probe or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("runtimeClassName")
    if probe is not None and used and used not in classes:
        problems.append(
            Problem(
                f"the probe DaemonSet {namespace}/{probe_name} names RuntimeClass {used}, which does not "
                "exist: the API refuses its pods",
                f"set its runtimeClassName to {runtime_class} (deploy/node-probe.yaml), or create {used}",
            )
        )
    if probe is not None and cdi and used != runtime_class:
        problems.append(
            Problem(
                f"CDI is on, and the probe DaemonSet {namespace}/{probe_name} runs with "
                f"{'RuntimeClass ' + used if used else 'the default runtime'}: only pods of RuntimeClass "
                f"{runtime_class} get GPUs, so the probe sees none",
                f"set spec.template.spec.runtimeClassName: {runtime_class} (deploy/node-probe.yaml)",
            )
        )
    uses = "no probe DaemonSet" if probe is None else f"the probe uses {used or 'the default runtime'}"
    return Outcome(
        f"GPU Operator {version or '(version unknown)'} {state}, CDI {'on' if cdi else 'off'}, "
        f"RuntimeClass {runtime_class} {'present' if runtime_class in classes else 'missing'}; {uses}",
        problems,
    )
