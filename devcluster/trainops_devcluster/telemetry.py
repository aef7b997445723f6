"""Simulated GPU and fabric telemetry of devcluster nodes, with fault injection.

One :class:`NodeTelemetry` per node, booted from a ``hardware.NodeProfile`` (GPU family, ECC,
NVLink bridge, MIG, fabric). It is served through the same interfaces production reads:
:class:`FakeNvml` (a pynvml-like module for the node probe, answering where and how the real NVML
does for that hardware), :class:`TelemetryIbReader` (the RDMA reader interface over the node's
sysfs view) and :func:`render_dcgm` (one node's dcgm-exporter ``/metrics`` text, which the
devcluster's real Prometheus scrapes). State changes and reads take the node's lock, so a server
thread and a controller thread can share a node.
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
from trainops.health.prometheus import DEFAULT_COUNTERS, GAUGES, RECOVERY_ACTION, XID_COUNT, XID_LAST
from trainops.health.report import Signal, Signals
from trainops_devcluster.hardware import NodeProfile, PortSpec

DRIVER_VERSION = "550.90.07"
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
# nvmlClocksEventReasons bits (NVML API reference): GpuIdle, SwPowerCap, HwSlowdown, SwThermal, HwThermal
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x8, 0x20, 0x40
IDLE_SM_CLOCK_MHZ = 345
GPU_COUNTERS = ("nvlink_replay", "nvlink_recovery", "nvlink_crc_flit", "nvlink_crc_data", "pcie_replay")
# What the simulated dcgm-exporter exports: the fields of deploy/dcgm-exporter-counters.csv that it
# simulates, with the recovery action uncommented (a 4.5.1-4.8.0 or later exporter); or, with
# DevCluster(exporter_counters="default"), dcgm-exporter's own default counters.
TRAINOPS_COUNTERS = frozenset({*GAUGES, XID_LAST, XID_COUNT})
COUNTER_SETS = {"trainops": TRAINOPS_COUNTERS, "default": DEFAULT_COUNTERS}


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
    retired_sbe: int = 0
    retired_dbe: int = 0
    retirement_pending: bool = False
    links_down: set[int] = field(default_factory=set)
    pcie_width: int = 16
    temp_offset_c: float = 0.0
    mig_lost: int = 0  # MIG devices gone from this GPU
    # dcgm-exporter serves these whatever it reads (a broken exporter: write_exporter_value)
    exporter_values: dict[str, float] = field(default_factory=dict)
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
    spec: PortSpec
    up: bool = True
    rate: str = ""
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IB_COUNTERS, 0))

    def __post_init__(self) -> None:
        self.up = self.up and self.spec.up
        self.rate = self.rate or self.spec.rate

    @property
    def device(self) -> str:
        return self.spec.device

    @property
    def port(self) -> int:
        return self.spec.port

    def files(self) -> dict[str, str]:
        """The port's sysfs file texts."""
        texts = {
            "state": "4: ACTIVE" if self.up else "1: DOWN",
            "phys_state": "5: LinkUp" if self.up else ("2: Polling" if self.spec.up else "3: Disabled"),
            "rate": self.rate if self.up else "10 Gb/sec (4X SDR)",
            "link_layer": self.spec.link_layer,
        }
        texts.update({f"counters/{name}": str(value) for name, value in self.counters.items()})
        return texts


class NodeTelemetry:
    """One node's simulated telemetry. Build with :meth:`from_profile` (or :meth:`healthy`), then inject faults."""

    def __init__(
        self,
        node_name: str,
        gpus: list[GpuState],
        ib_ports: list[IbPortState],
        clock=time.time,
        profile: NodeProfile | None = None,
    ):
        self.node_name = node_name
        self.gpus = gpus
        self.ib_ports = ib_ports
        self.profile = profile or NodeProfile(gpus=len(gpus))
        self.clock: Callable[[], float] = clock
        self.lock = threading.RLock()
        self.missing = False
        self.training_active = False
        self.stale_since: float | None = None
        self.exported: set[str] = set(TRAINOPS_COUNTERS)  # the fields the exporter's counters file names
        # what the exporter puts in its node label: the node's name when it has NODE_NAME (GPU
        # Operator sets it), else its own pod's name
        self.exporter_hostname = node_name
        self.boot_id = 0  # bumped by repair(): a node probe restarts (and re-opens NVML) after a reboot
        self.nvml_init_error: int | None = None  # NVML_ERROR_* that nvmlInit raises (driver or runtime)
        self.xid_events_supported = True

    @classmethod
    def from_profile(
        cls, node_name: str, profile: NodeProfile, seed: int = 0, clock=time.time
    ) -> NodeTelemetry:
        """A healthy node of ``profile``; per-GPU values vary a little, deterministically by seed."""
        rng = random.Random(f"{node_name}:{seed}")
        speed = profile.spec.gemm_tflops
        states = [
            GpuState(
                index=i,
                uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
                pci_bus_id=f"00000000:{PCI_BUS_IDS[i % len(PCI_BUS_IDS)]}:00.0",
                idle_temp_c=round(rng.uniform(29, 38)),
                busy_temp_c=round(rng.uniform(56, 70)),
                tflops=round(speed * rng.uniform(0.985, 1.015), 1),
                ecc_corrected=rng.randint(0, 4) if profile.ecc_on else 0,
                remapped_correctable=rng.randint(0, 1) if profile.family.row_remapping else 0,
                pcie_width=profile.spec.pcie_width,
            )
            for i in range(profile.gpu_count)
        ]
        ports = [IbPortState(spec) for spec in profile.ports]
        return cls(node_name, states, ports, clock, profile)

    @classmethod
    def healthy(cls, node_name: str, gpus: int = 8, seed: int = 0, clock=time.time) -> NodeTelemetry:
        """A healthy HGX H100 node with NDR InfiniBand."""
        return cls.from_profile(node_name, NodeProfile(gpus=gpus), seed, clock)

    # -- fault injection -------------------------------------------------------------------

    def inject_xid(self, code: int, gpu: int = 0) -> None:
        """An XID on one GPU; XID 79 (fallen off the bus) also makes the GPU lost to NVML."""
        with self.lock:
            state = self._gpu(gpu)
            state.xids.append((self.clock(), int(code)))
            if code == 79:
                state.lost = True

    def inject_ecc(self, uncorrectable: int, gpu: int = 0) -> None:
        """Uncorrectable ECC errors: Ampere and later remap the rows at the next reset (pending until
        then); Volta and Turing retire the pages (pending until the next driver reload)."""
        with self.lock:
            state = self._gpu(gpu)
            if not self.profile.ecc_on:
                raise ValueError(f"ECC is off on node {self.node_name}: its GPUs count no ECC errors")
            state.ecc_uncorrected += _count(uncorrectable, "uncorrectable")
            if self.profile.family.row_remapping:
                state.remapped_uncorrectable += uncorrectable
                state.remap_pending = state.remap_pending or uncorrectable > 0
            else:
                state.retired_dbe += uncorrectable
                state.retirement_pending = state.retirement_pending or uncorrectable > 0

    def remap_failure(self, gpu: int = 0) -> None:
        """A row remap failed (Ampere and later): the GPU needs replacing."""
        with self.lock:
            self._needs("row remapping", self.profile.family.row_remapping)
            self._gpu(gpu).remap_failure = True

    def retire_pages(self, count: int, gpu: int = 0, pending: bool = False) -> None:
        """Pages retired for single-bit errors (Volta, Turing); ``pending``: a retirement awaits a reload."""
        with self.lock:
            self._needs("page retirement", self.profile.family.page_retirement)
            state = self._gpu(gpu)
            state.retired_sbe += _count(count, "count")
            state.retirement_pending = state.retirement_pending or pending

    def nvlink_down(self, gpu: int = 0, link: int = 0) -> None:
        """One NVLink link of a GPU goes inactive."""
        with self.lock:
            family = self.profile.family
            self._needs("NVLink", family.nvlink != "none")
            if not 0 <= link < family.nvlink_links:
                raise ValueError(f"link must be in 0..{family.nvlink_links - 1} on {family.key}, got {link}")
            self._gpu(gpu).links_down.add(link)

    def pcie_degraded(self, width: int, gpu: int = 0) -> None:
        """The GPU's PCIe link trained narrower than its maximum (e.g. x8 of x16)."""
        with self.lock:
            if not 1 <= width <= self.profile.spec.pcie_width:
                raise ValueError(f"width must be in 1..{self.profile.spec.pcie_width}, got {width}")
            self._gpu(gpu).pcie_width = width

    def overheat(self, degrees: float, gpu: int = 0) -> None:
        """The GPU runs ``degrees`` hotter than it should (a failed fan or blocked airflow)."""
        with self.lock:
            self._gpu(gpu).temp_offset_c = float(degrees)

    def mig_device_lost(self, gpu: int = 0) -> None:
        """One MIG device of a GPU is gone (its GPU instance failed)."""
        with self.lock:
            self._needs("MIG", self.profile.mig_instances > 0)
            state = self._gpu(gpu)
            state.mig_lost = min(self.profile.mig_instances, state.mig_lost + 1)

    def ib_down(self, port: int = 1, device: str | None = None) -> None:
        """Take an RDMA port down (cable pulled: DOWN/Polling, link_downed counted); by default the
        first fabric port."""
        with self.lock:
            state = self._ib_port(device, port)
            if state.up:
                state.up = False
                state.counters["link_downed"] += 1

    def ib_rate(self, rate: str, port: int = 1, device: str | None = None) -> None:
        """An RDMA port trained at a lower rate (e.g. ``"200 Gb/sec (4X HDR)"`` on an NDR fabric)."""
        with self.lock:
            self._ib_port(device, port).rate = rate

    def ib_errors(self, counter: str, count: int, port: int = 1, device: str | None = None) -> None:
        """Count ``count`` more of an RDMA port error counter (e.g. ``symbol_error``)."""
        with self.lock:
            state = self._ib_port(device, port)
            if counter not in state.counters:
                raise ValueError(f"counter must be one of {', '.join(IB_COUNTERS)}, got {counter!r}")
            state.counters[counter] += _count(count, "count")

    def nvlink_errors(self, replay: int, gpu: int = 0) -> None:
        """NVLink replay errors on one GPU, counted now."""
        with self.lock:
            self._needs("NVLink", self.profile.family.nvlink != "none")
            self._gpu(gpu).increments["nvlink_replay"].append((self.clock(), _count(replay, "replay")))

    def pcie_replays(self, count: int, gpu: int = 0) -> None:
        """PCIe replays on one GPU, counted now."""
        with self.lock:
            self._gpu(gpu).increments["pcie_replay"].append((self.clock(), _count(count, "count")))

    def slow_gpu(self, factor: float, gpu: int | None = None) -> None:
        """Scale the speed of one GPU (or all) by ``factor``: 0.7 is 30% slow. While busy, a slowed
        GPU's SM clock drops by the same factor and NVML names the hardware slowdown."""
        if not 0 < factor <= 10:
            raise ValueError(f"factor must be in (0, 10], got {factor}")
        with self.lock:
            for state in self.gpus if gpu is None else [self._gpu(gpu)]:
                state.speed_factor = factor

    def set_missing(self, missing: bool = True) -> None:
        """Make all telemetry unavailable (driver gone, exporter down) or available again."""
        with self.lock:
            self.missing = missing

    def set_nvml_init_error(self, code: int | None) -> None:
        """Make ``nvmlInit`` fail with ``code`` (e.g. NVML_ERROR_LIBRARY_NOT_FOUND: the probe's pod got
        no driver library, as without ``runtimeClassName: nvidia`` under CDI); None: starts again.
        The probe meets it when it next starts NVML: its pod is restarted now (a new ``boot_id``)."""
        with self.lock:
            self.nvml_init_error = code
            self.boot_id += 1

    def set_xid_events_supported(self, supported: bool) -> None:
        """Whether NVML lets the probe register for XID events (some virtualised setups do not)."""
        with self.lock:
            self.xid_events_supported = supported

    def set_training_active(self, active: bool) -> None:
        """Training on the node: tensor cores busy, processes on every GPU, hotter, more power."""
        with self.lock:
            self.training_active = active

    def set_recovery_action(self, action: int, gpu: int = 0) -> None:
        """The driver's GPU recovery action (NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 reset, 2 reboot)."""
        with self.lock:
            self._gpu(gpu).recovery_action = int(action)

    def write_exporter_value(self, metric: str, value: float, gpu: int = 0) -> None:
        """dcgm-exporter serves ``value`` (NaN, an infinity) for ``metric`` of one GPU, whatever it
        reads: a broken or hostile exporter on the node."""
        with self.lock:
            self._gpu(gpu).exporter_values[metric] = float(value)

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
                state.retired_dbe, state.retirement_pending = 0, False
                state.links_down.clear()
                state.pcie_width, state.temp_offset_c, state.mig_lost = self.profile.spec.pcie_width, 0.0, 0
                state.xids.clear()
                state.exporter_values.clear()
                for increments in state.increments.values():
                    increments.clear()
            for port in self.ib_ports:
                port.up, port.rate = port.spec.up, port.spec.rate
            self.missing, self.stale_since, self.nvml_init_error = False, None, None
            self.boot_id += 1

    # -- readings ------------------------------------------------------------------------------

    def busy_reasons(self, state: GpuState) -> int:
        """The clock event reasons NVML reports now. Call under the lock."""
        if not self.training_active:
            return GPU_IDLE
        slowed = state.speed_factor < 1.0 or state.temp_offset_c > 0
        return SW_POWER_CAP | (HW_SLOWDOWN if slowed else 0)

    def sm_clock(self, state: GpuState) -> int:
        """The SM clock now (MHz): idle low; busy near the maximum, times the GPU's speed factor."""
        if not self.training_active:
            return IDLE_SM_CLOCK_MHZ
        return round(self.profile.spec.max_sm_clock_mhz * 0.97 * min(1.0, state.speed_factor))

    def temperature(self, state: GpuState) -> float:
        return (state.busy_temp_c if self.training_active else state.idle_temp_c) + state.temp_offset_c

    def gpu_metrics(self, state: GpuState) -> dict[str, float]:
        """dcgm-exporter values of one GPU, for the fields its counters file names and this GPU has; a
        lost GPU reports only its last XID. Call under the lock."""
        last_xid = {XID_LAST: float(state.xids[-1][1] if state.xids else 0)}
        if state.lost:
            return last_xid
        busy, profile = self.training_active, self.profile
        values: dict[str, float] = {
            "DCGM_FI_DEV_GPU_TEMP": self.temperature(state),
            "DCGM_FI_DEV_MEMORY_TEMP": self.temperature(state) + 6,
            "DCGM_FI_DEV_POWER_USAGE": profile.spec.power_limit_w * (0.87 if busy else 0.1),
            "DCGM_FI_DEV_SM_CLOCK": self.sm_clock(state),
            "DCGM_FI_DEV_MAX_SM_CLOCK": profile.spec.max_sm_clock_mhz,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": self.busy_reasons(state),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": state.counter("pcie_replay"),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.58 if busy else 0.0,
            RECOVERY_ACTION: state.recovery_action,
        }
        if not profile.mig_instances:
            values["DCGM_FI_DEV_GPU_UTIL"] = 97 if busy else 0
        if profile.ecc_on:  # DCGM reads the ECC counters through NVML: none with ECC off
            values.update(
                {
                    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": state.ecc_corrected,
                    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": state.ecc_uncorrected,
                    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": state.ecc_corrected,
                    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": state.ecc_uncorrected,
                }
            )
        if profile.family.row_remapping and not profile.mig_instances:
            values.update(
                {
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": state.remapped_correctable,
                    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": state.remapped_uncorrectable,
                    "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(state.remap_failure),
                    "DCGM_FI_DEV_ROW_REMAP_PENDING": int(state.remap_pending),
                }
            )
        if profile.family.page_retirement and profile.ecc_on:
            values.update(
                {
                    "DCGM_FI_DEV_RETIRED_SBE": state.retired_sbe,
                    "DCGM_FI_DEV_RETIRED_DBE": state.retired_dbe,
                    "DCGM_FI_DEV_RETIRED_PENDING": int(state.retirement_pending),
                }
            )
        if profile.family.nvlink != "none":
            values.update(
                {
                    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": state.counter("nvlink_replay"),
                    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": state.counter("nvlink_recovery"),
                    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": state.counter("nvlink_crc_flit"),
                    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": state.counter("nvlink_crc_data"),
                }
            )
        return {**{k: float(v) for k, v in values.items()}, **last_xid, **state.exporter_values}

    def xid_counts(self, state: GpuState, now: float) -> dict[int, int]:
        """XIDs seen in the exporter's window, by code. Call under the lock."""
        counts: dict[int, int] = {}
        for at, code in state.xids:
            if now - XID_WINDOW_S < at <= now:
                counts[code] = counts.get(code, 0) + 1
        return counts

    def labels(self, state: GpuState, node_label: str = "Hostname") -> dict[str, str]:
        return {
            "gpu": str(state.index),
            "UUID": state.uuid,
            "pci_bus_id": state.pci_bus_id,
            "device": f"nvidia{state.index}",
            "modelName": self.profile.spec.nvml_name,
            node_label: self.exporter_hostname,
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

    def _needs(self, feature: str, present: bool) -> None:
        if not present:
            raise ValueError(f"node {self.node_name} ({self.profile.describe()}) has no {feature}")

    def _ib_port(self, device: str | None, port: int) -> IbPortState:
        for state in self.ib_ports:
            if (device is None or state.device == device) and state.port == port:
                return state
        valid = ", ".join(f"{s.device}/{s.port}" for s in self.ib_ports) or "none"
        raise ValueError(f"no RDMA port {device or 'mlx5_0'}/{port} on node {self.node_name}; ports: {valid}")


def _count(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


# -- the node probe's view ------------------------------------------------------------------------


class TelemetryIbReader:
    """The RDMA reader interface (like ``SysfsIbReader``) over a node's telemetry: a node without an
    RDMA driver has no ``/sys/class/infiniband`` at all."""

    def __init__(self, telemetry: NodeTelemetry):
        self.telemetry = telemetry

    def read_ports(self) -> dict[str, Signals]:
        with self.telemetry.lock:
            if self.telemetry.missing:
                raise IbUnavailable("node telemetry unavailable")
            if not self.telemetry.ib_ports:
                raise IbUnavailable(
                    "no RDMA devices: /sys/class/infiniband does not exist (no RDMA driver on this node)"
                )
            return {f"{p.device}/{p.port}": port_signals(p.files()) for p in self.telemetry.ib_ports}


@dataclass
class _Handle:
    index: int
    mig: int | None = None  # a MIG device handle: its index under the parent


@dataclass
class _EventSet:
    cursors: dict[int, int] = field(default_factory=dict)  # gpu index -> XIDs already delivered


class FakeNvml:
    """A pynvml-like module over one node's telemetry, for the functions the node probe uses.

    Constants and ``NVMLError`` (with its per-code subclasses) are pynvml's own. It answers as the
    NVML API reference says the real one does for the node's hardware (``trainops.health.hardware``
    has the sources): NOT_SUPPORTED for NVLink on parts without it, for ECC counters with ECC off,
    for row remapping before Ampere and on MIG-enabled GPUs, for page retirement from Ampere on, for
    MIG queries before Ampere and for utilization on MIG-enabled GPUs; NO_PERMISSION for the MIG
    parent's process list (the probe runs unprivileged); every link present but inactive on an
    unbridged bridge-capable card; INVALID_ARGUMENT past the last link. Like NVML, XID events reach
    an event set only after registration. ``fail(function, code)`` makes one function raise.
    """

    def __init__(self, telemetry: NodeTelemetry):
        import pynvml

        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLError = pynvml.NVMLError
        self._field_value_type = pynvml.c_nvmlFieldValue_t
        self._telemetry = telemetry
        self._profile = telemetry.profile
        self._init_count = 0
        self._failures: dict[str, int] = {}

    def fail(self, function: str, code: int) -> None:
        """Make ``function`` raise NVMLError(code) from now on."""
        self._failures[function] = code

    def _error(self, code: int) -> Exception:
        return self.NVMLError(code)

    def _enter(self, function: str, handle: _Handle | None = None) -> GpuState | None:
        if function in self._failures:
            raise self._error(self._failures[function])
        if self._init_count == 0:
            raise self._error(self.NVML_ERROR_UNINITIALIZED)
        if self._telemetry.missing:
            raise self._error(self.NVML_ERROR_DRIVER_NOT_LOADED)
        if handle is None:
            return None
        state = self._telemetry.gpus[handle.index]
        if state.lost:
            raise self._error(self.NVML_ERROR_GPU_IS_LOST)
        return state

    def _get(self, function: str, handle: _Handle, read: Callable[[GpuState], Any]) -> Any:
        with self._telemetry.lock:
            return read(self._enter(function, handle))

    def _unsupported_if(self, condition: bool) -> None:
        if condition:
            raise self._error(self.NVML_ERROR_NOT_SUPPORTED)

    @property
    def _mig_on(self) -> bool:
        return self._profile.mig_instances > 0

    # -- library and device enumeration -------------------------------------------------------

    def nvmlInit(self) -> None:
        if self._telemetry.nvml_init_error is not None:
            raise self._error(self._telemetry.nvml_init_error)
        if self._telemetry.missing:
            raise self._error(self.NVML_ERROR_DRIVER_NOT_LOADED)
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
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._get("nvmlDeviceGetHandleByIndex", handle, lambda s: None)
        return handle

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._get("nvmlDeviceGetUUID", handle, lambda s: s.uuid)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._get("nvmlDeviceGetName", handle, lambda s: self._profile.spec.nvml_name)

    # -- thermals, power, clocks, utilization ---------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._get("nvmlDeviceGetTemperature", handle, self._telemetry.temperature))

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Handle, kind: int) -> int:
        thresholds = {
            self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
            self.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
            self.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: self._profile.spec.memory_max_temp_c,
        }
        self._get("nvmlDeviceGetTemperatureThreshold", handle, lambda s: None)
        self._unsupported_if(kind not in thresholds)
        return thresholds[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetCurrentClocksEventReasons", handle, self._telemetry.busy_reasons)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:
        self._get("nvmlDeviceGetClockInfo", handle, lambda s: None)
        self._unsupported_if(clock != self.NVML_CLOCK_SM)
        return self._get("nvmlDeviceGetClockInfo", handle, self._telemetry.sm_clock)

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock: int) -> int:
        self._get("nvmlDeviceGetMaxClockInfo", handle, lambda s: None)
        self._unsupported_if(clock != self.NVML_CLOCK_SM)
        return self._profile.spec.max_sm_clock_mhz

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._get("nvmlDeviceGetUtilizationRates", handle, lambda s: None)
        self._unsupported_if(self._mig_on)  # "On MIG-enabled GPUs ... not currently supported"
        busy = self._telemetry.training_active
        return SimpleNamespace(gpu=97 if busy else 0, memory=61 if busy else 0)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        busy = self._telemetry.training_active
        return self._get(
            "nvmlDeviceGetPowerUsage",
            handle,
            lambda s: int(self._profile.spec.power_limit_w * (870 if busy else 100)),
        )

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._get(
            "nvmlDeviceGetEnforcedPowerLimit", handle, lambda s: int(self._profile.spec.power_limit_w * 1000)
        )

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetPersistenceMode", handle, lambda s: self.NVML_FEATURE_ENABLED)

    # -- PCIe -----------------------------------------------------------------------------------

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        gen = self._profile.spec.pcie_gen
        return self._get(
            "nvmlDeviceGetCurrPcieLinkGeneration",
            handle,
            lambda s: gen if self._telemetry.training_active else 1,
        )

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetMaxPcieLinkGeneration", handle, lambda s: self._profile.spec.pcie_gen)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetCurrPcieLinkWidth", handle, lambda s: s.pcie_width)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetMaxPcieLinkWidth", handle, lambda s: self._profile.spec.pcie_width)

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._get("nvmlDeviceGetPcieReplayCounter", handle, lambda s: s.counter("pcie_replay"))

    # -- memory errors ----------------------------------------------------------------------------

    def nvmlDeviceGetEccMode(self, handle: _Handle) -> list[int]:
        mode = self.NVML_FEATURE_ENABLED if self._profile.ecc_on else self.NVML_FEATURE_DISABLED
        return self._get("nvmlDeviceGetEccMode", handle, lambda s: [mode, mode])

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        corrected = error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
        state = self._get("nvmlDeviceGetTotalEccErrors", handle, lambda s: s)
        self._unsupported_if(not self._profile.ecc_on)  # "Requires ECC Mode to be enabled"
        return state.ecc_corrected if corrected else state.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:
        state = self._get("nvmlDeviceGetRetiredPages", handle, lambda s: s)
        self._unsupported_if(not self._profile.family.page_retirement or not self._profile.ecc_on)
        single = cause == self.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(range(state.retired_sbe if single else state.retired_dbe))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        state = self._get("nvmlDeviceGetRetiredPagesPendingStatus", handle, lambda s: s)
        self._unsupported_if(not self._profile.family.page_retirement or not self._profile.ecc_on)
        return self.NVML_FEATURE_ENABLED if state.retirement_pending else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        state = self._get("nvmlDeviceGetRemappedRows", handle, lambda s: s)
        # "For Ampere or newer"; "On MIG-enabled GPUs with active instances ... not supported"
        self._unsupported_if(not self._profile.family.row_remapping or self._mig_on)
        return (
            state.remapped_correctable,
            state.remapped_uncorrectable,
            int(state.remap_pending),
            int(state.remap_failure),
        )

    # -- MIG ------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._get("nvmlDeviceGetMigMode", handle, lambda s: None)
        self._unsupported_if(not self._profile.family.mig)  # "For Ampere or newer" MIG-capable parts
        mode = self.NVML_DEVICE_MIG_ENABLE if self._mig_on else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._get("nvmlDeviceGetMaxMigDeviceCount", handle, lambda s: None)
        self._unsupported_if(not self._profile.family.mig)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        state = self._get("nvmlDeviceGetMigDeviceHandleByIndex", handle, lambda s: s)
        self._unsupported_if(not self._mig_on)
        if not 0 <= index < self._profile.mig_instances - state.mig_lost:
            raise self._error(self.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.index, index)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        def processes(state: GpuState) -> list[SimpleNamespace]:
            if (
                self._mig_on and handle.mig is None
            ):  # the parent's: "only if the caller has appropriate privileges"
                raise self._error(self.NVML_ERROR_NO_PERMISSION)
            busy = [SimpleNamespace(pid=4242 + state.index, usedGpuMemory=71 * 2**30)]
            return busy if self._telemetry.training_active else []

        return self._get("nvmlDeviceGetComputeRunningProcesses", handle, processes)

    # -- NVLink ---------------------------------------------------------------------------------

    def _link(self, function: str, handle: _Handle, link: int) -> GpuState:
        state = self._get(function, handle, lambda s: s)
        family = self._profile.family
        self._unsupported_if(family.nvlink == "none")
        if not 0 <= link < family.nvlink_links:
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        return state

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        state = self._link("nvmlDeviceGetNvLinkState", handle, link)
        unbridged = self._profile.family.nvlink == "bridge" and not self._profile.bridge
        if unbridged or link in state.links_down:
            return self.NVML_FEATURE_DISABLED
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        names = {
            self.NVML_NVLINK_ERROR_DL_REPLAY: "nvlink_replay",
            self.NVML_NVLINK_ERROR_DL_RECOVERY: "nvlink_recovery",
            self.NVML_NVLINK_ERROR_DL_CRC_FLIT: "nvlink_crc_flit",
            self.NVML_NVLINK_ERROR_DL_CRC_DATA: "nvlink_crc_data",
        }
        state = self._link("nvmlDeviceGetNvLinkErrorCounter", handle, link)
        if counter not in names:
            raise self._error(self.NVML_ERROR_INVALID_ARGUMENT)
        return state.counter(names[counter]) * (link == 0)  # injected errors are all counted on link 0

    # -- recovery action and XID events -------------------------------------------------------------

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
        self._unsupported_if(
            not self._telemetry.xid_events_supported or event_types & ~self.nvmlEventTypeXidCriticalError
        )
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
        raise self._error(self.NVML_ERROR_TIMEOUT)  # simulated: no real waiting

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.cursors.clear()


# -- the exporter's and Prometheus's view -------------------------------------------------------


def _series(telemetry: NodeTelemetry, now: float, node_label: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every dcgm-exporter series of a node; none while missing."""
    with telemetry.lock:
        if telemetry.missing:
            return []
        out = []
        for state in telemetry.gpus:
            labels = telemetry.labels(state, node_label)
            out += [(metric, labels, value) for metric, value in telemetry.gpu_metrics(state).items()]
            for code, count in sorted(telemetry.xid_counts(state, now).items()):
                out.append((XID_COUNT, {**labels, "xid": str(code)}, float(count)))
        return out


def render_dcgm(telemetry: NodeTelemetry, node_label: str = "Hostname") -> str:
    """One node's dcgm-exporter ``/metrics`` text (empty while the node's telemetry is missing; the
    values read at ``stale_since``, stamped with that time, while the exporter is stale).
    ``node_label``: ``Hostname`` as released dcgm-exporter 4.x names it, ``hostname`` on its main branch."""
    with telemetry.lock:
        stale_since, exported = telemetry.stale_since, set(telemetry.exported)
    at = telemetry.clock() if stale_since is None else stale_since
    stamp = "" if stale_since is None else f" {int(stale_since * 1000)}"
    lines: list[str] = []
    seen: set[str] = set()
    for metric, labels, value in sorted(_series(telemetry, at, node_label), key=lambda s: s[0]):
        if metric not in exported:
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
