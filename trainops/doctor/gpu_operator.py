"""GPU Operator: its version and state, CDI, and the RuntimeClass the node probe needs.

From the operator's ClusterPolicy (``nvidia.com/v1``) and the RuntimeClasses.  With CDI on (the
default from v25.10.0) the operator does not make ``nvidia`` the default runtime: only pods that
name its RuntimeClass get GPUs, so a probe DaemonSet without ``runtimeClassName`` sees no GPU.
A probe that names a RuntimeClass that does not exist gets no pod at all.

Driver upgrades: with the operator-managed driver (``spec.driver.enabled``, the default) the driver
manager (k8s-driver-manager, the driver pod's init container) must unload the kernel module, which
fails while any process holds NVML ("driver is in use"). It evicts only pods that request
``nvidia.com/gpu*``/``nvidia.com/mig-*`` (or hold an NVIDIA DRA claim) and never DaemonSet pods
(``internal/kubernetes`` ``DeleteOrEvictPods``, ``cmd/nvdrain`` before v0.9.0: ``IgnoreAllDaemonSets``),
whatever ``ENABLE_GPU_POD_EVICTION`` says (GPU Operator's upgrade controller deletes the same kind of
pods, ``gpuPodSpecFilter``); it moves the rest by node labels:
the operands' ``nvidia.com/gpu.deploy.<operand>``, ``nvidia.com/gpu.deploy.client`` for third-party
clients (v0.12.0, GPU Operator v26.7.0: it waits for DaemonSet pods with that key in their
nodeSelector), and the label named in ``NODE_LABEL_FOR_GPU_POD_EVICTION`` (not waited for). A probe
DaemonSet selecting on none of them stays on the node and the upgrade stalls there.
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
# Driver upgrades (k8s-driver-manager cmd/driver-manager/main.go; gpu-operator controllers/state_manager.go)
CLIENT_LABEL = "nvidia.com/gpu.deploy.client"  # GPU Operator puts it on GPU nodes from v26.7.0
PAUSED = "paused-for-driver-upgrade"  # what the driver manager sets a "true" label to while it upgrades
CLIENT_LABEL_FROM = (26, 7)  # GPU Operator version that labels nodes and ships driver manager v0.12.0
CLIENT_PAUSE_FROM = (0, 12)  # driver manager version that pauses CLIENT_LABEL and waits for its pods
CUSTOM_LABEL_ENV = "NODE_LABEL_FOR_GPU_POD_EVICTION"  # a label it also pauses (v0.6.3+), without waiting
HOLD_NVML = "--hold-nvml"  # the probe keeps NVML open between samples (trainops probe)
# the probe's flags that hold the driver for its life: NVML kept open, or --gemm's CUDA context
HOLDS_DRIVER = (HOLD_NVML, "--gemm")
OPERAND_LABELS = tuple(  # the operands' labels the driver manager pauses (v0.12.0), waiting by app label only
    f"nvidia.com/gpu.deploy.{name}"
    for name in (
        "operator-validator",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "mig-manager",
        "nvsm",
        "sandbox-validator",
        "sandbox-device-plugin",
        "vgpu-device-manager",
        "dra-driver",
        "dra-validator",
        "dcgm-dra",
        "dcgm-exporter-dra",
    )
)
MANAGER_ENV = "ClusterPolicy spec.driver.manager.env (Helm driver.manager.env)"


def operator_version(policy: dict) -> str | None:
    """The chart's app version on the ClusterPolicy's labels (``v25.10.0``), if any."""
    labels = (policy.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/version"):
        return labels["app.kubernetes.io/version"]
    chart = labels.get("helm.sh/chart") or ""
    return chart.removeprefix("gpu-operator-") if chart.startswith("gpu-operator-") else None


def _release(version: str | None) -> tuple[int, ...] | None:
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def holds_driver(spec: dict) -> str | None:
    """The flag with which the probe pod ``spec`` holds the driver for its life, wherever its command
    line has it (args, command, a shell string); None when it lets NVML go between samples."""
    line = " ".join(
        str(part)
        for c in spec.get("containers") or []
        for part in (c.get("command") or []) + (c.get("args") or [])
    )
    return next((flag for flag in HOLDS_DRIVER if re.search(rf"(?<![\w-]){flag}(?![\w-])", line)), None)


def driver_manager_version(policy: dict, version: str | None) -> tuple[str | None, bool | None]:
    """The driver manager's version (``spec.driver.manager.version``, else the one the operator's
    ``version`` ships, as far as told) and whether it pauses ``CLIENT_LABEL`` (None: cannot tell)."""
    named = (((policy.get("spec") or {}).get("driver") or {}).get("manager") or {}).get("version")
    release = _release(named)
    if release is not None:
        return named, release[:2] >= CLIENT_PAUSE_FROM
    operator = _release(version)
    if operator is None:
        return None, None
    if operator[:2] >= CLIENT_LABEL_FROM:
        return f"of GPU Operator {version} (v0.12.0 or later)", True
    return f"of GPU Operator {version} (older than v0.12.0)", False


def _node_selection(template_spec: dict) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The probe's nodeSelector, and the keys its required node affinity wants (``In``) with their values."""
    selector = {k: str(v) for k, v in (template_spec.get("nodeSelector") or {}).items()}
    required = ((template_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    wanted: dict[str, list[str]] = {}
    for term in required.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("operator") == "In":
                wanted.setdefault(expression.get("key", ""), []).extend(expression.get("values") or [])
    return selector, wanted


def driver_upgrade(
    policy: dict, version: str | None, probe: dict | None, where: str
) -> tuple[str, list[Problem]]:
    """Whether a driver upgrade moves the probe (``where``: its DaemonSet's namespace/name) off the node
    before unloading the driver: a few words for the summary, and the problem when it would stall."""
    driver = (policy.get("spec") or {}).get("driver") or {}
    if driver.get("enabled") is False:
        return "driver on the host (no upgrade unloads it)", []
    if probe is None:
        return "", []
    spec = ((probe.get("spec") or {}).get("template") or {}).get("spec") or {}
    selector, affinity = _node_selection(spec)
    manager, pauses_client = driver_manager_version(policy, version)
    env = {e.get("name"): e.get("value") for e in (driver.get("manager") or {}).get("env") or []}
    custom = env.get(CUSTOM_LABEL_ENV) or ""
    paused = set(OPERAND_LABELS) | ({custom} if custom else set())
    waited = {CLIENT_LABEL} if pauses_client else set()
    paused |= waited
    # a label the driver manager flips from a value the probe wants ("false" stays "false")
    selects = sorted(k for k, v in selector.items() if k in paused and v not in ("", "false"))
    affine = sorted(k for k, values in affinity.items() if k in paused and set(values) - {"", "false"})
    hold = holds_driver(spec)
    label = f'{CLIENT_LABEL}: "true"'
    if set(selects) & waited:
        return f"driver upgrades move the probe off the node first ({CLIENT_LABEL}, waited for)", []
    if selects or affine:
        how = f"nodeSelector {selects[0]}" if selects else f"node affinity on {affine[0]}"
        if not hold:
            return (
                f"driver upgrades pause the probe by {how} without waiting for it to go (it lets NVML go "
                "between samples)",
                [],
            )
        return how, [
            Problem(
                f"the probe DaemonSet {where} runs with {hold} (the driver held between samples) and is paused for "
                f"a driver upgrade by {how}, which the driver manager does not wait for: unloading the driver "
                'can fail while it still runs ("driver is in use")',
                f"drop {hold} from its args (deploy/node-probe.yaml), or select nodes by {label} on GPU "
                "Operator v26.7.0 or later (the driver manager waits for DaemonSet pods with that nodeSelector key)",
            )
        ]
    held = (
        f"the probe DaemonSet {where} opens NVML but is neither evicted (the driver manager evicts only pods "
        "that request nvidia.com/gpu*, never DaemonSet pods) nor paused"
    )
    stall = 'a driver upgrade stalls on its nodes: the kernel module cannot unload ("driver is in use")'
    by_hand = (
        f"label the GPU nodes {CLIENT_LABEL}=true and set {CUSTOM_LABEL_ENV}={CLIENT_LABEL} in {MANAGER_ENV}, "
        f"or upgrade GPU Operator to v{CLIENT_LABEL_FROM[0]}.{CLIENT_LABEL_FROM[1]}.0 or later (it labels the "
        "nodes and its driver manager pauses that label)"
    )
    if CLIENT_LABEL in selector or CLIENT_LABEL in affinity:
        which = manager or "of this GPU Operator (version unknown: no spec.driver.manager.version)"
        return "", [
            Problem(
                f"{held}: it selects nodes by {CLIENT_LABEL}, which the driver manager {which} does not set to "
                f"{PAUSED}, and {CUSTOM_LABEL_ENV} names {custom or 'no label'}; {stall}",
                by_hand,
            )
        ]
    fix = f"add {label} to its nodeSelector (deploy/node-probe.yaml)"
    if not pauses_client:
        fix += f"; this GPU Operator's driver manager does not pause it by itself: {by_hand}"
    return "", [
        Problem(
            f"{held}: its nodeSelector has no label the driver manager sets to {PAUSED} ({CLIENT_LABEL}"
            f"{', ' + custom if custom else ''}); {stall}",
            fix,
        )
    ]


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
    upgrade, stalls = driver_upgrade(policy, version, probe, f"{namespace}/{probe_name}")
    problems += stalls
    uses = "no probe DaemonSet" if probe is None else f"the probe uses {used or 'the default runtime'}"
    return Outcome(
        f"GPU Operator {version or '(version unknown)'} {state}, CDI {'on' if cdi else 'off'}, "
        f"RuntimeClass {runtime_class} {'present' if runtime_class in classes else 'missing'}; {uses}"
        + (f"; {upgrade}" if upgrade and not stalls else ""),
        problems,
    )
