"""Read every GPU of this node through NVML, via a pynvml-like module passed in.

Production passes ``pynvml`` (see :func:`load_pynvml`); tests and the devcluster pass
``trainops_devcluster.telemetry.FakeNvml``. NVML's ``NOT_SUPPORTED`` makes a signal not applicable
(this GPU does not have it; the policy checks that against the GPU's identity, ``hardware``); any
other ``NVMLError`` (or a function this pynvml lacks) makes it unknown with the error as its reason.
Nothing defaults to healthy. When NVML cannot start at all, ``gpu_count`` is unknown and its
reason names the fix (see ``INIT_FIXES``).

XID events reach NVML clients only after they register for them, so a reader watches from
:meth:`NvmlReader.start` on and keeps what it saw for ``xid_lookback_s``. Two ways to use one reader
across reports:

* held (``start()`` once, or ``with NvmlReader(...)``): NVML stays open and XIDs are watched
  continuously (``trainops probe --publish --hold-nvml``; the devcluster's probe daemon);
* sampled (:meth:`NvmlReader.sample` per report, the ``--publish`` default): NVML is open only while a
  sample runs (nvmlInit, XID registration, the reads, nvmlShutdown), so between samples the probe
  holds nothing of the driver and a GPU Operator driver upgrade can unload it. XIDs raised between
  samples are not seen then: ``xid_events`` lists those seen while sampling, and when there are none
  it is unknown (saying so), for the gate to fill from dcgm-exporter's XID series. Without persistence
  mode (``persistence_mode`` warns) and no other NVML client, the driver deinitialises the GPUs when
  the last client leaves, so each sample initialises them again (slower samples).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainops.health.report import Signal, Signals

NVLINK_COUNTERS = {
    "counter_nvlink_replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "counter_nvlink_recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "counter_nvlink_crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "counter_nvlink_crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}
TEMPERATURE_THRESHOLDS = {
    "temp_slowdown_c": "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "temp_shutdown_c": "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "temp_gpu_max_c": "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
    "temp_mem_max_c": "NVML_TEMPERATURE_THRESHOLD_MEM_MAX",
}
RECOVERY_ACTION_PREFIX = "NVML_GPU_RECOVERY_ACTION_"
# Why nvmlInit fails in a pod, and what fixes it (reference/hardware.md §3; deploy/node-probe.yaml).
INIT_FIXES = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "the probe's container was given no NVIDIA driver library: run it with runtimeClassName: nvidia "
        "(GPU Operator with CDI, its default since v25.10), or as this cluster's container toolkit injects "
        "GPUs (deploy/node-probe.yaml lists the settings)"
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "no NVIDIA kernel driver is loaded on this node: check the GPU Operator's driver pod (or the "
        "host driver) on it"
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "the probe may not open /dev/nvidia*: give it the GPUs through the nvidia runtime class (or "
        "NVIDIA_VISIBLE_DEVICES where the toolkit honours it), see deploy/node-probe.yaml"
    ),
}
PERMISSION_HINT = "the unprivileged probe may not read this (NVML: Insufficient Permissions)"
XIDS_BETWEEN_SAMPLES = (
    "no XID seen while the probe sampled; it lets NVML go between samples (so a driver upgrade can "
    "unload the driver) and sees no XID raised then: dcgm-exporter's XID series fill this (or run "
    "the probe with --hold-nvml to watch XIDs continuously)"
)


def load_pynvml() -> ModuleType:
    """The real ``pynvml`` module (nvidia-ml-py), imported only when a probe runs."""
    import pynvml

    return pynvml


class NvmlReader:
    """Reads GPU signals. Held: ``with NvmlReader(pynvml) as r: r.read()``; sampled: ``r.sample()``
    per report, NVML open only while it runs (XIDs seen are kept across samples)."""

    def __init__(self, nvml: Any, xid_lookback_s: float = 7200.0, clock: Callable[[], float] = time.time):
        self.nvml = nvml
        self.xid_lookback_s = xid_lookback_s
        self.clock = clock
        self._init_error: str | None = "NVML not started"
        self._event_set: Any = None
        self._xid_unknown: dict[int, str] = {}
        self._xids: list[tuple[float, int, int]] = []  # (seen at, gpu index, xid)
        self._watch_since = 0.0
        self._held = False  # started by start() (or ``with``), until close()
        self._sampling = False  # inside sample(): XIDs were not watched before this sample began

    def __enter__(self) -> NvmlReader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Initialise NVML and register for XID events on every GPU; NVML stays open until ``close``."""
        self._held = True
        self._open()

    def _open(self) -> None:
        self._xid_unknown = {}
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as err:
            fix = next(
                (text for name, text in INIT_FIXES.items() if err.value == getattr(self.nvml, name, None)),
                "check the NVIDIA driver and the probe's access to the GPUs (deploy/node-probe.yaml)",
            )
            self._init_error = f"NVML cannot start: {err}; {fix}"
            return
        self._init_error = None
        self._watch_since = self.clock()
        try:
            self._event_set = self.nvml.nvmlEventSetCreate()
        except self.nvml.NVMLError as err:
            self._xid_unknown = {-1: f"nvmlEventSetCreate: {err}"}
            return
        count = self._read("nvmlDeviceGetCount")
        for index in range(count.value or 0):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                self.nvml.nvmlDeviceRegisterEvents(
                    handle, self.nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except self.nvml.NVMLError as err:
                self._xid_unknown[index] = f"XID events not available: {err}"

    def close(self) -> None:
        """Free the XID event set and shut NVML down (it was initialised once, so it is shut down once)."""
        self._held = False
        self._release()

    def _release(self) -> None:
        if self._init_error is not None:
            return  # nvmlInit failed (nothing to shut down) or already shut down
        self._init_error = "NVML closed"
        event_set, self._event_set = self._event_set, None
        try:
            if event_set is not None:
                self.nvml.nvmlEventSetFree(event_set)
        finally:  # shut down even when the event set cannot be freed (a driver going away)
            self.nvml.nvmlShutdown()

    def sample(self, xid_wait_ms: int = 0) -> tuple[Signals, dict[str, Signals]]:
        """One sample with NVML open only while it runs: nvmlInit and the XID registration, ``read``,
        then the event set freed and nvmlShutdown, even when a read fails. NVML counts its inits, so a
        held reader is read as it is instead."""
        if self._held:
            return self.read(xid_wait_ms)
        self._open()
        self._sampling = True
        try:
            return self.read(xid_wait_ms)
        finally:
            self._sampling = False
            try:
                self._release()
            except self.nvml.NVMLError:
                pass  # the driver went away under the sample: there is nothing left to release

    def read(self, xid_wait_ms: int = 0) -> tuple[Signals, dict[str, Signals]]:
        """Node-level signals and per-GPU signals (keyed by GPU index as a string)."""
        if self._init_error is not None:
            return {"gpu_count": Signal.unknown(self._init_error)}, {}
        self._drain_xids(xid_wait_ms)
        count = self._read("nvmlDeviceGetCount")
        node = {
            "gpu_count": count,
            "driver_version": self._read("nvmlSystemGetDriverVersion", convert=_text),
            "xid_watch_since": Signal(self._watch_since),
        }
        gpus = {str(index): self._read_gpu(index) for index in range(count.value or 0)}
        return node, gpus

    def _read(self, function: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> Signal:
        fn = getattr(self.nvml, function, None)
        if fn is None:
            return Signal.unknown(f"{function} is not available in this pynvml")
        try:
            return Signal(convert(fn(*args)))
        except self.nvml.NVMLError as err:
            return self._failed(function, err)

    def _failed(self, function: str, err: Any) -> Signal:
        """NOT_SUPPORTED: not applicable on this GPU; anything else: unknown (NO_PERMISSION says so)."""
        if err.value == self._const("NVML_ERROR_NOT_SUPPORTED"):
            return Signal.not_applicable(f"{function}: {err}")
        if err.value == self._const("NVML_ERROR_NO_PERMISSION"):
            return Signal.unknown(f"{function}: {PERMISSION_HINT}")
        return Signal.unknown(f"{function}: {err}")

    def _const(self, name: str) -> Any:
        return getattr(self.nvml, name)

    def _read_gpu(self, index: int) -> Signals:
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        except self.nvml.NVMLError as err:
            lost = err.value == self._const("NVML_ERROR_GPU_IS_LOST")
            state = Signal(True) if lost else Signal.unknown(f"nvmlDeviceGetHandleByIndex: {err}")
            return {"gpu_lost": state, **self._xid_signals(index)}
        enabled = self._const("NVML_FEATURE_ENABLED")
        signals: Signals = {
            "gpu_lost": Signal(False),
            "uuid": self._read("nvmlDeviceGetUUID", handle, convert=_text),
            "model": self._read("nvmlDeviceGetName", handle, convert=_text),
            "temperature_c": self._read(
                "nvmlDeviceGetTemperature", handle, self._const("NVML_TEMPERATURE_GPU")
            ),
            "clock_event_reasons": self._read_clock_event_reasons(handle),
            "power_w": self._read("nvmlDeviceGetPowerUsage", handle, convert=_milli),
            "power_limit_w": self._read("nvmlDeviceGetEnforcedPowerLimit", handle, convert=_milli),
            "pcie_link_gen": self._read("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "pcie_link_gen_max": self._read("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "pcie_link_width": self._read("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "pcie_link_width_max": self._read("nvmlDeviceGetMaxPcieLinkWidth", handle),
            "counter_pcie_replay": self._read("nvmlDeviceGetPcieReplayCounter", handle),
            "persistence_mode": self._read(
                "nvmlDeviceGetPersistenceMode", handle, convert=lambda v: v == enabled
            ),
            "running_processes": self._read("nvmlDeviceGetComputeRunningProcesses", handle, convert=len),
            "utilization_pct": self._read("nvmlDeviceGetUtilizationRates", handle, convert=lambda u: u.gpu),
            "sm_clock_mhz": self._read("nvmlDeviceGetClockInfo", handle, self._const("NVML_CLOCK_SM")),
            "sm_clock_max_mhz": self._read("nvmlDeviceGetMaxClockInfo", handle, self._const("NVML_CLOCK_SM")),
            "ecc_mode": self._read("nvmlDeviceGetEccMode", handle, convert=lambda v: v[0] == enabled),
            "retired_pages_pending": self._read(
                "nvmlDeviceGetRetiredPagesPendingStatus", handle, convert=lambda v: v == enabled
            ),
            "recovery_action": self._read_recovery_action(handle),
            **self._xid_signals(index),
        }
        for name, threshold in TEMPERATURE_THRESHOLDS.items():
            signals[name] = self._read("nvmlDeviceGetTemperatureThreshold", handle, self._const(threshold))
        for kind in ("corrected", "uncorrected"):
            for scope in ("volatile", "aggregate"):
                signals[f"ecc_{kind}_{scope}"] = self._read(
                    "nvmlDeviceGetTotalEccErrors",
                    handle,
                    self._const(f"NVML_MEMORY_ERROR_TYPE_{kind.upper()}"),
                    self._const(f"NVML_{scope.upper()}_ECC"),
                )
        signals["pcie_link_width_degraded"] = _below(
            signals["pcie_link_width"], signals["pcie_link_width_max"]
        )
        signals["retired_pages"] = self._read_retired_pages(handle)
        signals.update(self._read_mig(handle))
        signals.update(self._read_remapped_rows(handle))
        signals.update(self._read_nvlink(handle))
        return signals

    def _read_clock_event_reasons(self, handle: Any) -> Signal:
        if hasattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
            return self._read("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self._read("nvmlDeviceGetCurrentClocksThrottleReasons", handle)  # pynvml < 12.535

    def _read_retired_pages(self, handle: Any) -> Signal:
        causes = ("MULTIPLE_SINGLE_BIT_ECC_ERRORS", "DOUBLE_BIT_ECC_ERROR")
        parts = [
            self._read(
                "nvmlDeviceGetRetiredPages",
                handle,
                self._const(f"NVML_PAGE_RETIREMENT_CAUSE_{c}"),
                convert=len,
            )
            for c in causes
        ]
        unknown = [p for p in parts if not p.known]
        return unknown[0] if unknown else Signal(sum(p.value for p in parts))

    def _read_mig(self, handle: Any) -> Signals:
        """``mig_mode`` (current); with MIG on, ``mig_devices`` (the MIG devices that exist now) and
        ``running_processes`` summed over them: NVML lists the parent GPU's processes only to privileged
        callers, each MIG device's to anyone (NVML API reference, nvmlDeviceGetComputeRunningProcesses)."""
        mode = self._read(
            "nvmlDeviceGetMigMode", handle, convert=lambda v: v[0] == self._const("NVML_DEVICE_MIG_ENABLE")
        )
        if mode.value is not True:
            devices = mode if not mode.known else Signal.not_applicable("MIG is disabled on this GPU")
            return {"mig_mode": mode, "mig_devices": devices}
        slots = self._read("nvmlDeviceGetMaxMigDeviceCount", handle)
        if not slots.known:
            return {"mig_mode": mode, "mig_devices": slots, "running_processes": slots}
        handles = []
        for index in range(slots.value):
            try:
                handles.append(self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
            except self.nvml.NVMLError as err:
                if err.value == self._const("NVML_ERROR_NOT_FOUND"):
                    continue  # an empty slot
                failed = self._failed("nvmlDeviceGetMigDeviceHandleByIndex", err)
                return {"mig_mode": mode, "mig_devices": failed, "running_processes": failed}
        per_device = [self._read("nvmlDeviceGetComputeRunningProcesses", h, convert=len) for h in handles]
        unknown = [s for s in per_device if not s.known]
        processes = unknown[0] if unknown else Signal(sum(s.value for s in per_device))
        return {"mig_mode": mode, "mig_devices": Signal(len(handles)), "running_processes": processes}

    def _read_remapped_rows(self, handle: Any) -> Signals:
        names = (
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "row_remap_pending",
            "row_remap_failure",
        )
        rows = self._read("nvmlDeviceGetRemappedRows", handle)
        if not rows.known:
            return {name: rows for name in names}
        correctable, uncorrectable, pending, failure = rows.value
        values = (correctable, uncorrectable, bool(pending), bool(failure))
        return {name: Signal(value) for name, value in zip(names, values, strict=True)}

    def _read_recovery_action(self, handle: Any) -> Signal:
        field_id = getattr(self.nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return Signal.unknown("this pynvml has no GPU recovery action field")
        values = self._read("nvmlDeviceGetFieldValues", handle, [field_id])
        if not values.known:
            return values
        value = values.value[0]
        if value.nvmlReturn != self._const("NVML_SUCCESS"):
            return Signal.unknown(f"GPU recovery action field: {self.nvml.NVMLError(value.nvmlReturn)}")
        names = {
            getattr(self.nvml, name): name.removeprefix(RECOVERY_ACTION_PREFIX)
            for name in dir(self.nvml)
            if name.startswith(RECOVERY_ACTION_PREFIX)
        }
        return Signal(names.get(value.value.uiVal, f"code {value.value.uiVal}"))

    def _read_nvlink(self, handle: Any) -> Signals:
        """Links NVML answers for (asked per link until it answers INVALID_ARGUMENT or NOT_SUPPORTED),
        how many are active, and the error counters of the active ones. No link at all: not applicable."""
        names = ["nvlink_links", "nvlink_active_links", "nvlink_inactive_links", *NVLINK_COUNTERS]
        absent = {self._const("NVML_ERROR_NOT_SUPPORTED"), self._const("NVML_ERROR_INVALID_ARGUMENT")}
        states: dict[int, int] = {}
        for link in range(self._const("NVML_NVLINK_MAX_LINKS")):
            try:
                states[link] = self.nvml.nvmlDeviceGetNvLinkState(handle, link)
            except self.nvml.NVMLError as err:
                if err.value not in absent:
                    return {
                        name: Signal.unknown(f"nvmlDeviceGetNvLinkState({link}): {err}") for name in names
                    }
        if not states:
            return {
                name: Signal.not_applicable("no NVLink on this GPU (nvmlDeviceGetNvLinkState: Not Supported)")
                for name in names
            }
        active = [link for link, state in states.items() if state == self._const("NVML_FEATURE_ENABLED")]
        signals = {
            "nvlink_links": Signal(len(states)),
            "nvlink_active_links": Signal(len(active)),
            "nvlink_inactive_links": Signal(len(states) - len(active)),
        }
        for name, counter in NVLINK_COUNTERS.items():
            per_link = [
                self._read("nvmlDeviceGetNvLinkErrorCounter", handle, link, self._const(counter))
                for link in active
            ]
            unknown = [s for s in per_link if not s.known]
            signals[name] = unknown[0] if unknown else Signal(sum(s.value for s in per_link))
        return signals

    def _drain_xids(self, wait_ms: int) -> None:
        now = self.clock()
        self._xids = [x for x in self._xids if x[0] >= now - self.xid_lookback_s]
        if self._event_set is None:
            return
        while True:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self._event_set, wait_ms)
            except self.nvml.NVMLError as err:
                if err.value != self._const("NVML_ERROR_TIMEOUT"):
                    self._xid_unknown[-1] = f"nvmlEventSetWait_v2: {err}"
                return
            index = self.nvml.nvmlDeviceGetIndex(event.device)
            self._xids.append((now, index, int(event.eventData)))
            wait_ms = 0

    def _xid_signals(self, index: int) -> Signals:
        """``xid_events``: the XIDs seen on the GPU within ``xid_lookback_s``; ``xid_events_at``: when
        the newest of them was seen (absent when none)."""
        reason = self._xid_unknown.get(index) or self._xid_unknown.get(-1)
        if reason:
            return {"xid_events": Signal.unknown(reason)}
        seen = [(at, xid) for at, gpu, xid in self._xids if gpu == index]
        if self._sampling and not seen:
            return {"xid_events": Signal.unknown(XIDS_BETWEEN_SAMPLES)}
        signals = {"xid_events": Signal(sorted({xid for _, xid in seen}))}
        if seen:
            signals["xid_events_at"] = Signal(max(at for at, _ in seen))
        return signals


def _below(current: Signal, maximum: Signal) -> Signal:
    """Whether a link runs below its maximum. Generation is not compared: GPUs downshift it at idle."""
    if not (current.known and maximum.known):
        return current if not current.known else maximum
    return Signal(current.value < maximum.value)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _milli(value: int) -> float:
    return value / 1000.0
