"""Faults injected into the devcluster: pods and Jobs that crash or hang, GPUs and nodes that fail.

Telemetry faults change the node's ``NodeTelemetry`` (what dcgm-exporter, NVML and sysfs report).
Faults that a real node would not survive the job of also fail the pods they hit, like NVIDIA's
stack does to a CUDA process: an XID that kills the GPU's contexts, uncorrectable ECC, a downed
InfiniBand port (NCCL aborts), a node that stops responding.  Each such fault also records a
Warning Event on the node.

Broken hardware stays broken until ``repair`` (the node rebooted with its faults fixed), as on a
real node:

* **The GPU leaves allocatable.** NVIDIA's k8s-device-plugin marks a GPU Unhealthy on any XID
  critical-error event whose code is not in its skip list (13, 31, 43, 45, 68, 109 by default;
  ``DP_DISABLE_HEALTHCHECKS`` adds codes or ``all``, ``DP_ENABLE_HEALTHCHECKS`` takes codes out of
  it) and never marks it healthy again while it runs (NVIDIA/k8s-device-plugin
  ``internal/rm/health.go``; issue #234). The kubelet's device manager then reports
  ``status.allocatable["nvidia.com/gpu"]`` as the healthy devices and ``status.capacity`` as all of
  them (kubernetes ``pkg/kubelet/cm/devicemanager/manager.go`` ``GetCapacity``), and hands the
  device to no new pod. Uncorrectable ECC counts: the driver reports it as an XID (48, or 94/95 on
  GPUs that contain it), none of which the plugin skips.  This set is the device plugin's, not
  ``FATAL_XIDS`` (which pods die): 13 and 31 kill the application but leave the GPU allocatable,
  109 too; 63 or 92 kill nothing but take the GPU out.
* **A downed fabric port keeps failing GPU pods.** NCCL's IB transport skips a port that is not
  ACTIVE when it starts (NVIDIA/nccl ``src/transport/net_ib.cc`` ``ncclIbInit``), so a job pinned
  to that HCA (``NCCL_IB_HCA``, ``NCCL_NET=IB``) cannot initialise its communicator: every GPU pod
  that starts on the node fails ``runtime.NCCL_ABORT_S`` after it starts, with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainops.health import xids
from trainops_devcluster.conditions import set_condition
from trainops_devcluster.events import WARNING, EventRecorder
from trainops_devcluster.informer import Key
from trainops_devcluster.podutil import controller_uid
from trainops_devcluster.runtime import Exit, PodNotRunning, PodRuntime
from trainops_devcluster.store import NotFound, Store

# XIDs after which the CUDA contexts on the GPU are gone (the application is killed or must restart):
# NVIDIA's catalog says restart the application or reset the GPU, or the NVLink5 sub-code may say so.
# Informational or recoverable ones (e.g. 63 row remap, 92 high SBE rate, 154 recovery action) are not here.
FATAL_XIDS = frozenset(
    {code for code, (_, action) in xids.CATALOG.items() if action == "RESTART_APP"}
    | set(xids.FATAL)
    | set(xids.UNDECODED)
)
# NVIDIA k8s-device-plugin's ignoredXids (internal/rm/health.go): application errors after which
# the GPU stays healthy.  Every other XID critical error marks the GPU Unhealthy.
DEVICE_PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DISABLE_HEALTHCHECKS, ENABLE_HEALTHCHECKS = "DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS"


def _xid_list(text: str) -> tuple[bool, set[int]]:
    """The device plugin's reading of one of its env variables: (``all``/``xids`` named, the codes)."""
    codes: set[int] = set()
    for part in text.lower().split(","):
        part = part.strip()
        if part in ("all", "xids"):
            return True, set()
        if part.isdigit():
            codes.add(int(part))
    return False, codes


def device_plugin_marks_unhealthy(code: int, env: Mapping[str, str] | None = None) -> bool:
    """Whether NVIDIA's device plugin marks a GPU Unhealthy on XID ``code``, given its environment
    (``DP_DISABLE_HEALTHCHECKS``, ``DP_ENABLE_HEALTHCHECKS``), as ``getDisabledHealthCheckXids`` and
    ``disabledXIDs.IsDisabled`` decide it."""
    env = env or {}
    all_disabled, disabled = _xid_list(env.get(DISABLE_HEALTHCHECKS, ""))
    all_enabled, enabled = _xid_list(env.get(ENABLE_HEALTHCHECKS, ""))
    if all_enabled:
        return True
    if code in enabled:
        return True
    return not (all_disabled or code in disabled or code in DEVICE_PLUGIN_SKIPPED_XIDS)


XID_MEANING = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    46: "GPU stopped processing (timeout)",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}


class Faults:
    """The devcluster's fault injection (``DevCluster.inject`` and ``trainops devcluster inject`` call these)."""

    def __init__(
        self,
        store: Store,
        telemetry: Mapping,
        runtime: PodRuntime,
        device_plugin_env: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.runtime = runtime
        # the device plugin's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS (unset: its defaults)
        self.device_plugin_env = dict(device_plugin_env or {})
        self.events = EventRecorder(store, "nvidia-device-health")

    # ---- pods and jobs -----------------------------------------------------------------
    def crash_pod(
        self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error", message: str = ""
    ) -> dict:
        """The pod's containers die now with ``exit_code`` (reason e.g. ``Error``, ``OOMKilled``) and
        termination ``message`` (what the container wrote, e.g. a CUDA error)."""
        self.runtime.crash(namespace, name, Exit(exit_code, reason, message))
        return {"pods": [name]}

    def crash_job(self, namespace: str, job: str) -> dict:
        """Every running pod of the Job dies with exit code 1."""
        names = self._running_job_pods(namespace, job)
        for name in names:
            self.runtime.crash(namespace, name, Exit(1, "Error"))
        return {"pods": names}

    def hang_job(self, namespace: str, job: str) -> dict:
        """The Job's running pods stay Running but make no progress (processes are stopped)."""
        names = self._running_job_pods(namespace, job)
        for name in names:
            self.runtime.hang(namespace, name)
        return {"pods": names}

    def _running_job_pods(self, namespace: str, job: str) -> list[str]:
        found = self.store.find("jobs.batch", namespace, job)
        if found is None:
            raise NotFound(f'jobs.batch "{job}" not found in namespace "{namespace}"')
        uid = found["metadata"]["uid"]
        pods, _ = self.store.list("pods", namespace)
        return [
            p["metadata"]["name"]
            for p in pods
            if controller_uid(p) == uid
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    # ---- GPUs and nodes ----------------------------------------------------------------
    def xid(self, node: str, code: int, gpu: int = 0) -> dict:
        """An XID on one GPU; a fatal one also fails the pods using that GPU, and one the device
        plugin does not skip takes the GPU out of the node's allocatable until ``repair``."""
        self._telemetry(node).inject_xid(code, gpu=gpu)
        meaning = XID_MEANING.get(code, "GPU error")
        message = f"Xid {code} on GPU {gpu}: {meaning}"
        self._node_event(node, "XidError", message)
        failed = self._fail(self.runtime.pods_on_gpus(node, gpu), message) if code in FATAL_XIDS else []
        if device_plugin_marks_unhealthy(code, self.device_plugin_env):
            self.runtime.gpu_unhealthy(node, gpu)
        return {"failed_pods": failed}

    def ecc(self, node: str, uncorrectable: int, gpu: int = 0) -> dict:
        """Uncorrectable ECC errors on one GPU: the process using it is killed (as with Xid 48), and
        the GPU leaves the node's allocatable until ``repair`` (the driver's XID for it, 48 or 94/95,
        is not one the device plugin skips)."""
        self._telemetry(node).inject_ecc(uncorrectable, gpu=gpu)
        message = f"{uncorrectable} uncorrectable ECC error(s) on GPU {gpu}"
        self._node_event(node, "EccError", message)
        failed = self._fail(self.runtime.pods_on_gpus(node, gpu), message) if uncorrectable > 0 else []
        if uncorrectable > 0 and device_plugin_marks_unhealthy(48, self.device_plugin_env):
            self.runtime.gpu_unhealthy(node, gpu)
        return {"failed_pods": failed}

    def ib_down(self, node: str, port: int = 1, device: str | None = None) -> dict:
        """An RDMA port goes down (the first fabric port unless ``device`` says): NCCL on the node's GPU
        pods aborts, and on each GPU pod that starts there until ``repair``."""
        self._telemetry(node).ib_down(port=port, device=device)
        message = f"InfiniBand port {device or 'mlx5_0'}/{port} is down"
        self._node_event(node, "InfiniBandPortDown", message)
        self.runtime.fabric_down(node, f"NCCL error: {message}")
        return {"failed_pods": self._fail(self.runtime.pods_on_gpus(node), f"NCCL error: {message}")}

    def nvlink_errors(self, node: str, replay: int, gpu: int = 0) -> dict:
        """NVLink replay errors (recovered by the link; jobs keep running)."""
        self._telemetry(node).nvlink_errors(replay, gpu=gpu)
        return {"failed_pods": []}

    def hardware(self, node: str, fault: str, *args, **kwargs) -> dict:
        """A hardware fault the node's jobs survive (a link down, a slow port, a hot GPU...): one of
        ``NodeTelemetry``'s fault methods, by name; the node's health report shows it."""
        getattr(self._telemetry(node), fault)(*args, **kwargs)
        return {"failed_pods": []}

    def nvml_init_error(self, node: str, error: str) -> dict:
        """The node probe's NVML cannot start (``NVML_ERROR_LIBRARY_NOT_FOUND``: its pod got no driver)."""
        import pynvml

        if not error.startswith("NVML_ERROR_") or not isinstance(getattr(pynvml, error, None), int):
            raise ValueError(
                f"error must be an NVML_ERROR_* name such as NVML_ERROR_LIBRARY_NOT_FOUND, got {error!r}"
            )
        self._telemetry(node).set_nvml_init_error(getattr(pynvml, error))
        return {"failed_pods": []}

    def slow_gpu(self, node: str, factor: float, gpu: int | None = None) -> dict:
        """One GPU (or all) runs at ``factor`` of its speed."""
        self._telemetry(node).slow_gpu(factor, gpu=gpu)
        return {"failed_pods": []}

    def repair(self, node: str) -> dict:
        """The node rebooted with its faults fixed (its probe then reports it healthy again): the
        device plugin starts afresh with every GPU healthy, so all are allocatable again, and the
        fabric port is up."""
        self._telemetry(node).repair()
        self.runtime.restore_node(node)
        return {"failed_pods": []}

    def telemetry_missing(self, node: str) -> dict:
        """The node's telemetry stops being available."""
        self._telemetry(node).set_missing(True)
        return {"failed_pods": []}

    def node_not_ready(self, node: str) -> dict:
        """The node stops responding: ``Ready=Unknown`` (the lifecycle controller then taints it) and
        its pods die with it."""
        self._set_ready(node, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        message = f"node {node} stopped responding"
        self._node_event(node, "NodeNotReady", f"Node {node} status is now: NodeNotReady")
        return {"failed_pods": self._fail(self.runtime.running_pods(node), message, exit_code=137)}

    def node_ready(self, node: str) -> dict:
        """The node is back: ``Ready=True`` (the lifecycle controller removes its taints)."""
        self._set_ready(node, "True", "KubeletReady", "kubelet is posting ready status")
        return {"failed_pods": []}

    # ---- helpers -----------------------------------------------------------------------
    def _telemetry(self, node: str):
        if node not in self.telemetry:
            raise NotFound(f'node "{node}" has no telemetry (known nodes: {len(self.telemetry)})')
        return self.telemetry[node]

    def _set_ready(self, node: str, status: str, reason: str, message: str) -> None:
        self.store.mutate("nodes", "", node, lambda obj: set_condition(obj, "Ready", status, reason, message))

    def _node_event(self, node: str, reason: str, message: str) -> None:
        obj = self.store.find("nodes", "", node)
        if obj is None:
            raise NotFound(f'node "{node}" not found')
        self.events.record(obj, reason, message, WARNING, host=node)

    def _fail(self, pods: list[Key], message: str, exit_code: int = 1) -> list[str]:
        failed = []
        for namespace, name in pods:
            try:
                self.runtime.crash(namespace, name, Exit(exit_code, "Error", message))
            except PodNotRunning:
                continue
            failed.append(f"{namespace}/{name}")
        return failed
