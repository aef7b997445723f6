"""Simulated GPU and fabric telemetry of devcluster nodes, with fault injection.

One :class:`NodeTelemetry` per node holds HGX-H100-like state. It is served through the same
interfaces production reads: :class:`FakeNvml` (a pynvml-like module for the node probe),
:class:`TelemetryIbReader` (the InfiniBand reader interface), :func:`render_dcgm` (one node's
dcgm-exporter ``/metrics`` text, which the devcluster's real Prometheus scrapes).
State changes and reads take the node's lock, so a server thread and a controller thread can
share a node.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from trainops.health.ib_reader import IbUnavailable, port_signals
from trainops.health.prometheus import XID_COUNT, XID_LAST
from trainops.health.report import Signal, Signals

MODEL = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "550.90.07"
NVLINKS = 18
IB_RATE = "400 Gb/sec (4X NDR)"
IB_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_xmit_discards",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "port_rcv_remote_physical_errors",
)
PCI_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
XID_WINDOW_S = 300.0  # dcgm-exporter's default --xid-count-window-size
GPU_IDLE, HW_SLOWDOWN = 0x1, 0x8
GPU_COUNTERS = ("nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data", "pcie_replay")


@dataclass
class GpuState:
    index: int
    uuid: str
    pci_bus_id: str
    idle_temp_c: float
    busy_temp_c: float
    tflops: float
    speed_factor: float = 1.0
    lost: bool = False
    recovery_action: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    xids: list[tuple[float, int]] = field(default_factory=list)  # (time, code)
    increments: dict[str, list[tuple[float, int]]] = field(
        default_factory=lambda: {c: [] for c in GPU_COUNTERS}
    )

    def counter(self, name: str) -> int:
        return sum(n for _, n in self.increments[name])

    def increase(self, name: str, since: float) -> int:
        return sum(n for t, n in self.increments[name] if t > since)


@dataclass
class IbPortState:
    device: str
    port: int
    up: bool = True
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IB_COUNTERS, 0))

    def files(self) -> dict[str, str]:
        """The port's sysfs file texts."""
        texts = {
            "state": "4: ACTIVE" if self.up else "1: DOWN",
            "phys_state": "5: LinkUp" if self.up else "2: Polling",
            "rate": IB_RATE if self.up else "10 Gb/sec (4X SDR)",
            "link_layer": "InfiniBand",
        }
        texts.update({f"counters/{name}": str(value) for name, value in self.counters.items()})
        return texts


class NodeTelemetry:
    """One node's simulated telemetry. Build with :meth:`healthy`, then inject faults."""

    def __init__(self, node_name: str, gpus: list[GpuState], ib_ports: list[IbPortState], clock=time.time):
        self.node_name = node_name
        self.gpus = gpus
        self.ib_ports = ib_ports
        self.clock: Callable[[], float] = clock
        self.lock = threading.RLock()
        self.missing = False
        self.training_active = False
        self.stale_since: float | None = None
        self.disabled_metrics: set[str] = set()  # not in the exporter's counters CSV
        self.boot_id = 0  # bumped by repair(): a node probe restarts (and re-opens NVML) after a reboot

    @classmethod
    def healthy(cls, node_name: str, gpus: int = 8, seed: int = 0, clock=time.time) -> NodeTelemetry:
        """A healthy 8-GPU HGX node; per-GPU values vary a little, deterministically by seed."""
        if gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {gpus}")
        rng = random.Random(f"{node_name}:{seed}")
        states = [
            GpuState(
                index=i,
                uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
                pci_bus_id=f"00000000:{PCI_BUS_IDS[i % len(PCI_BUS_IDS)]}:00.0",
                idle_temp_c=round(rng.uniform(29, 38)),
                busy_temp_c=round(rng.uniform(56, 70)),
                tflops=round(720 * rng.uniform(0.985, 1.015), 1),
                ecc_corrected=rng.randint(0, 4),
                remapped_correctable=rng.randint(0, 1),
            )
            for i in range(gpus)
        ]
        ports = [IbPortState(f"mlx5_{i}", 1) for i in range(8)]
        return cls(node_name, states, ports, clock)

    # -- fault injection -------------------------------------------------------------------

    def inject_xid(self, code: int, gpu: int = 0) -> None:
        """An XID on one GPU; XID 79 (fallen off the bus) also makes the GPU lost to NVML."""
        with self.lock:
            state = self._gpu(gpu)
            state.xids.append((self.clock(), int(code)))
            if code == 79:
                state.lost = True

    def inject_ecc(self, uncorrectable: int, gpu: int = 0) -> None:
        """Uncorrectable ECC errors; like Ampere+ GPUs, the rows are remapped at the next reset."""
        with self.lock:
            state = self._gpu(gpu)
            state.ecc_uncorrected += _count(uncorrectable, "uncorrectable")
            state.remapped_uncorrectable += uncorrectable
            state.remap_pending = state.remap_pending or uncorrectable > 0

    def ib_down(self, port: int = 1, device: str = "mlx5_0") -> None:
        """Take an InfiniBand port down (cable pulled: DOWN/Polling, link_downed counted)."""
        with self.lock:
            state = self._ib_port(device, port)
            if state.up:
                state.up = False
                state.counters["link_downed"] += 1

    def nvlink_errors(self, replay: int, gpu: int = 0) -> None:
        """NVLink replay errors on one GPU, counted now."""
        with self.lock:
            self._gpu(gpu).increments["nvlink_replay"].append((self.clock(), _count(replay, "replay")))

    def slow_gpu(self, factor: float, gpu: int | None = None) -> None:
        """Scale the speed of one GPU (or all) by ``factor``: 0.7 is 30% slow."""
        if not 0 < factor <= 10:
            raise ValueError(f"factor must be in (0, 10], got {factor}")
        with self.lock:
            for state in self.gpus if gpu is None else [self._gpu(gpu)]:
                state.speed_factor = factor

    def set_missing(self, missing: bool = True) -> None:
        """Make all telemetry unavailable (driver gone, exporter down) or available again."""
        with self.lock:
            self.missing = missing

    def set_training_active(self, active: bool) -> None:
        """Training on the node: tensor cores busy, processes on every GPU, hotter, more power."""
        with self.lock:
            self.training_active = active

    def set_recovery_action(self, action: int, gpu: int = 0) -> None:
        """The driver's GPU recovery action (NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 reset, 2 reboot)."""
        with self.lock:
            self._gpu(gpu).recovery_action = int(action)

    def set_stale(self, since: float | None) -> None:
        """The exporter serves the values it read at ``since``, stamped with that time (None: fresh again)."""
        with self.lock:
            self.stale_since = since

    def repair(self) -> None:
        """The node rebooted with its faults fixed: every injected fault cleared, a new ``boot_id``."""
        with self.lock:
            for state in self.gpus:
                state.lost, state.recovery_action, state.speed_factor = False, 0, 1.0
                state.ecc_uncorrected, state.remap_pending, state.remap_failure = 0, False, False
                state.xids.clear()
                for increments in state.increments.values():
                    increments.clear()
            for port in self.ib_ports:
                port.up = True
            self.missing, self.stale_since = False, None
            self.boot_id += 1

    # -- readings ------------------------------------------------------------------------------

    def gpu_metrics(self, state: GpuState) -> dict[str, float]:
        """dcgm-exporter values of one GPU; a lost GPU reports only its XIDs. Call under the lock."""
        last_xid = {XID_LAST: float(state.xids[-1][1] if state.xids else 0)}
        if state.lost:
            return last_xid
        busy = self.training_active
        values = {
            "DCGM_FI_DEV_GPU_TEMP": state.busy_temp_c if busy else state.idle_temp_c,
            "DCGM_FI_DEV_MEMORY_TEMP": (state.busy_temp_c if busy else state.idle_temp_c) + 6,
            "DCGM_FI_DEV_POWER_USAGE": 610.0 if busy else 72.0,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": state.ecc_corrected,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": state.ecc_uncorrected,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": state.ecc_corrected,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": state.ecc_uncorrected,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": state.remapped_correctable,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": state.remapped_uncorrectable,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(state.remap_failure),
            "DCGM_FI_DEV_ROW_REMAP_PENDING": int(state.remap_pending),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0 if busy else GPU_IDLE,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": state.counter("pcie_replay"),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": state.counter("nvlink_replay"),
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": state.counter("nvlink_recovery"),
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": state.counter("nvlink_crc_flit"),
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": state.counter("nvlink_crc_data"),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.58 if busy else 0.0,
            "DCGM_FI_DEV_GPU_RECOVERY_ACTION": state.recovery_action,
        }
        return {**{k: float(v) for k, v in values.items()}, **last_xid}

    def xid_counts(self, state: GpuState, now: float) -> dict[int, int]:
        """XIDs seen in the exporter's window, by code. Call under the lock."""
        counts: dict[int, int] = {}
        for at, code in state.xids:
            if now - XID_WINDOW_S < at <= now:
                counts[code] = counts.get(code, 0) + 1
        return counts

    def labels(self, state: GpuState) -> dict[str, str]:
        return {
            "gpu": str(state.index),
            "UUID": state.uuid,
            "pci_bus_id": state.pci_bus_id,
            "device": f"nvidia{state.index}",
            "modelName": MODEL,
            "Hostname": self.node_name,
            "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
        }

    def measure_speed(self, gpu_count: int) -> list[Signal]:
        """What the probe's GEMM would measure (TFLOP/s per GPU); usable as its ``speed_probe``."""
        with self.lock:
            if self.missing:
                return [Signal.unknown("node telemetry unavailable")] * gpu_count
            return [
                Signal.unknown("GPU is lost") if s.lost else Signal(round(s.tflops * s.speed_factor, 1))
                for s in self.gpus[:gpu_count]
            ]

    def _gpu(self, gpu: int) -> GpuState:
        if not 0 <= gpu < len(self.gpus):
            raise ValueError(f"gpu must be in 0..{len(self.gpus) - 1} on node {self.node_name}, got {gpu}")
        return self.gpus[gpu]

    def _ib_port(self, device: str, port: int) -> IbPortState:
        for state in self.ib_ports:
            if (state.device, state.port) == (device, port):
                return state
        valid = ", ".join(f"{s.device}/{s.port}" for s in self.ib_ports)
        raise ValueError(f"no InfiniBand port {device}/{port} on node {self.node_name}; ports: {valid}")


def _count(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


# -- the node probe's view ------------------------------------------------------------------------


class TelemetryIbReader:
    """The InfiniBand reader interface (like ``SysfsIbReader``) over a node's telemetry."""

    def __init__(self, telemetry: NodeTelemetry):
        self.telemetry = telemetry

    def read_ports(self) -> dict[str, Signals]:
        with self.telemetry.lock:
            if self.telemetry.missing:
                raise IbUnavailable("node telemetry unavailable")
            return {f"{p.device}/{p.port}": port_signals(p.files()) for p in self.telemetry.ib_ports}


@dataclass
class _Handle:
    index: int


@dataclass
class _EventSet:
    cursors: dict[int, int] = field(default_factory=dict)  # gpu index -> XIDs already delivered


class FakeNvml:
    """A pynvml-like module over one node's telemetry, for the functions the node probe uses.

    Constants and ``NVMLError`` (with its per-code subclasses) are pynvml's own. Like NVML,
    XID events reach an event set only after registration. ``fail(function, code)`` makes one
    function raise, to exercise error paths.
    """

    def __init__(self, telemetry: NodeTelemetry):
        import pynvml

        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLError = pynvml.NVMLError
        self._field_value_type = pynvml.c_nvmlFieldValue_t
        self._telemetry = telemetry
        self._init_count = 0
        self._failures: dict[str, int] = {}

    def fail(self, function: str, code: int) -> None:
        """Make ``function`` raise NVMLError(code) from now on."""
        self._failures[function] = code

    def _enter(self, function: str, handle: _Handle | None = None) -> GpuState | None:
        if function in self._failures:
            raise self.NVMLError(self._failures[function])
        if self._init_count == 0:
            raise self.NVMLError(self.NVML_ERROR_UNINITIALIZED)
        if self._telemetry.missing:
            raise self.NVMLError(self.NVML_ERROR_DRIVER_NOT_LOADED)
        if handle is None:
            return None
        state = self._telemetry.gpus[handle.index]
        if state.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return state

    def nvmlInit(self) -> None:
        if self._telemetry.missing:
            raise self.NVMLError(self.NVML_ERROR_DRIVER_NOT_LOADED)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._telemetry.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._telemetry.gpus):
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._get("nvmlDeviceGetHandleByIndex", handle, lambda s: None)
        return handle

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def _get(self, function: str, handle: _Handle, read: Callable[[GpuState], Any]) -> Any:
        with self._telemetry.lock:
            return read(self._enter(function, handle))

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._get("nvmlDeviceGetUUID", handle, lambda s: s.uuid)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._get("nvmlDeviceGetName", handle, lambda s: MODEL)

    def _metric(self, function: str, handle: _Handle, metric: str) -> float:
        t = self._telemetry
        return self._get(function, handle, lambda s: t.gpu_metrics(s)[metric])

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._metric("nvmlDeviceGetTemperature", handle, "DCGM_FI_DEV_GPU_TEMP"))

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Handle, kind: int) -> int:
        thresholds = {
            self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
            self.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
            self.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
        }
        self._get("nvmlDeviceGetTemperatureThreshold", handle, lambda s: None)
        if kind not in thresholds:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return thresholds[kind]

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        corrected = error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self._get(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            lambda s: s.ecc_corrected if corrected else s.ecc_uncorrected,
        )

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:
        self._get("nvmlDeviceGetRetiredPages", handle, lambda s: None)
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # Hopper uses row remapping instead

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        self._get("nvmlDeviceGetRetiredPagesPendingStatus", handle, lambda s: None)
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._get(
            "nvmlDeviceGetRemappedRows",
            handle,
            lambda s: (
                s.remapped_correctable,
                s.remapped_uncorrectable,
                int(s.remap_pending),
                int(s.remap_failure),
            ),
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return int(
            self._metric("nvmlDeviceGetCurrentClocksEventReasons", handle, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        )

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return int(self._metric("nvmlDeviceGetPowerUsage", handle, "DCGM_FI_DEV_POWER_USAGE") * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetEnforcedPowerLimit", handle, lambda s: 700_000)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetCurrPcieLinkGeneration", handle, lambda s: 5 if self._busy() else 1)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetMaxPcieLinkGeneration", handle, lambda s: 5)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetCurrPcieLinkWidth", handle, lambda s: 16)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetMaxPcieLinkWidth", handle, lambda s: 16)

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetPcieReplayCounter", handle, lambda s: s.counter("pcie_replay"))

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._get("nvmlDeviceGetNvLinkState", handle, lambda s: None)
        if not 0 <= link < NVLINKS:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        names = {
            self.NVML_NVLINK_ERROR_DL_REPLAY: "nvlink_replay",
            self.NVML_NVLINK_ERROR_DL_RECOVERY: "nvlink_recovery",
            self.NVML_NVLINK_ERROR_DL_CRC_FLIT: "nvlink_crc_flit",
            self.NVML_NVLINK_ERROR_DL_CRC_DATA: "nvlink_crc_data",
        }
        if not 0 <= link < NVLINKS or counter not in names:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        # Injected errors are all counted on link 0.
        return self._get(
            "nvmlDeviceGetNvLinkErrorCounter", handle, lambda s: s.counter(names[counter]) * (link == 0)
        )

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetPersistenceMode", handle, lambda s: self.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        def processes(state: GpuState) -> list[SimpleNamespace]:
            busy = [SimpleNamespace(pid=4242 + state.index, usedGpuMemory=71 * 2**30)]
            return busy if self._busy() else []

        return self._get("nvmlDeviceGetComputeRunningProcesses", handle, processes)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[int]) -> list[Any]:
        state = self._get("nvmlDeviceGetFieldValues", handle, lambda s: s)
        values = []
        for field_id in field_ids:
            value = self._field_value_type()
            value.fieldId = field_id
            if field_id == self.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.nvmlReturn = self.NVML_SUCCESS
                value.value.uiVal = state.recovery_action
            else:
                value.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
            values.append(value)
        return values

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        state = self._get("nvmlDeviceRegisterEvents", handle, lambda s: s)
        if event_types & ~(self.nvmlEventTypeXidCriticalError):
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        with self._telemetry.lock:
            event_set.cursors[handle.index] = len(state.xids)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        with self._telemetry.lock:
            for index, delivered in sorted(event_set.cursors.items()):
                xids = self._telemetry.gpus[index].xids
                if delivered < len(xids):
                    event_set.cursors[index] = delivered + 1
                    code = xids[delivered][1]
                    return SimpleNamespace(
                        device=_Handle(index), eventType=self.nvmlEventTypeXidCriticalError, eventData=code
                    )
        raise self.NVMLError(self.NVML_ERROR_TIMEOUT)  # simulated: no real waiting

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.cursors.clear()

    def _busy(self) -> bool:
        return self._telemetry.training_active


# -- the exporter's and Prometheus's view -------------------------------------------------------


def _series(telemetry: NodeTelemetry, now: float) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every dcgm-exporter series of a node; none while missing."""
    with telemetry.lock:
        if telemetry.missing:
            return []
        out = []
        for state in telemetry.gpus:
            labels = telemetry.labels(state)
            out += [(metric, labels, value) for metric, value in telemetry.gpu_metrics(state).items()]
            for code, count in sorted(telemetry.xid_counts(state, now).items()):
                out.append((XID_COUNT, {**labels, "xid": str(code)}, float(count)))
        return out


def render_dcgm(telemetry: NodeTelemetry) -> str:
    """One node's dcgm-exporter ``/metrics`` text (empty while the node's telemetry is missing; the
    values read at ``stale_since``, stamped with that time, while the exporter is stale)."""
    with telemetry.lock:
        stale_since, disabled = telemetry.stale_since, set(telemetry.disabled_metrics)
    at = telemetry.clock() if stale_since is None else stale_since
    stamp = "" if stale_since is None else f" {int(stale_since * 1000)}"
    lines: list[str] = []
    seen: set[str] = set()
    for metric, labels, value in sorted(_series(telemetry, at), key=lambda s: s[0]):
        if metric in disabled:
            continue
        if metric not in seen:
            seen.add(metric)
            lines += [f"# HELP {metric} {metric} (trainops devcluster).", f"# TYPE {metric} gauge"]
        rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{metric}{{{rendered}}} {_number(value)}{stamp}")
    return "\n".join(lines) + ("\n" if lines else "")


def _number(value: float) -> str:
    """A sample value as Prometheus writes it: shortest exact form, integers without a fraction."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
