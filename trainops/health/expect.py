"""What a node should report, from its identity: the signals the policy derives before it judges.

A reading NVML answers NOT_SUPPORTED for is not applicable (the report says so); here it is checked
against what the GPU is (``hardware``: NVML's product name, dcgm-exporter's ``modelName`` or GFD's
``nvidia.com/gpu.product``) and how it is set up (ECC mode, MIG mode):

* a feature the GPU does not have (NVLink on an L4, row remapping on a V100 or under MIG, page
  retirement from Ampere on, ECC counters with ECC off) is **not applicable**, whatever a source
  could not read: shown, never excluding;
* a feature it has but NVML calls unsupported is **unknown**: a reason to exclude, naming the fix.

Derived signals: per GPU ``nvlink_links_down`` (links the product should have active but has not;
a bridge-capable PCIe card with every link inactive has no bridge fitted); per node
``gpus_missing`` comparing like with like under MIG (GFD's ``single`` strategy counts MIG devices
as ``nvidia.com/gpu``, ``mixed`` as ``nvidia.com/mig-<profile>``), ``fabric_ports`` and
``ib_ports_missing`` (only the ports of the node's fabric, see ``fabric``); per port
``ib_rate_shortfall_gbps`` against the fabric's rate. The report itself is left as it is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainops.conventions import GPU_COUNT_LABEL, GPU_RESOURCE, IB_PORT_COUNT_LABEL
from trainops.health.fabric import Fabric, Fabrics
from trainops.health.hardware import GPU_PRODUCT_LABEL, MIG_STRATEGY_LABEL, GpuFamily, family_of
from trainops.health.report import HealthReport, Signal, Signals, get_signal
from trainops.health.slowdown import recorded

# nvmlClocksEventReasons that mean the hardware holds the clocks down: HwSlowdown, SwThermal,
# HwThermal, HwPowerBrake (NVML API reference; SwPowerCap, 0x4, is a busy GPU at its power limit).
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
BUSY_UTILIZATION_PCT = 50
MIG_RESOURCE = re.compile(r"nvidia\.com/mig-[0-9a-z.]+")
COUNT = re.compile(r"[0-9]{1,5}")
NVLINK_RATES = (
    "nvlink_replay_per_min",
    "nvlink_recovery_per_min",
    "nvlink_crc_flit_per_min",
    "nvlink_crc_data_per_min",
)
ECC_SIGNALS = (
    "ecc_uncorrected_volatile",
    "ecc_corrected_volatile",
    "ecc_uncorrected_aggregate",
    "ecc_corrected_aggregate",
)
REMAP_SIGNALS = (
    "row_remap_failure",
    "row_remap_pending",
    "remapped_rows_uncorrectable",
    "remapped_rows_correctable",
)
RETIREMENT_SIGNALS = ("retired_pages", "retired_pages_pending")
PORT_SIGNALS = (
    "ib_state",
    "ib_phys_state",
    "ib_rate_shortfall_gbps",
    "symbol_error_per_min",
    "link_error_recovery_per_min",
    "link_downed_per_min",
    "port_rcv_errors_per_min",
    "port_xmit_discards_per_min",
)


@dataclass
class Derived:
    """Signals that overlay the report's, per target (node, each GPU, each port)."""

    node: Signals
    gpus: dict[str, Signals]
    ports: dict[str, Signals]


def derive(
    report: HealthReport, node: Mapping[str, Any] | None, fabrics: Fabrics, now: float, window_s: float
) -> Derived:
    """The derived signals of ``report`` for the Node object ``node`` (None: only what the report says)."""
    labels = _labels(node)
    gpus = {key: _gpu(signals, labels) for key, signals in report.gpus.items()}
    node_signals = {"gpus_missing": _gpus_missing(report, node, gpus), **_slowdown(node, now, window_s)}
    fabric, why = fabrics.of(labels)
    ports, fabric_node = _fabric(report, labels, fabric, why)
    node_signals.update(fabric_node)
    return Derived(node_signals, gpus, ports)


def _labels(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("labels") or {}


# -- GPUs -------------------------------------------------------------------------------------------


def _gpu(signals: Signals, labels: Mapping[str, str]) -> Signals:
    """The GPU's signals that its hardware changes (see ``_apply``); the others stand as reported."""
    model = get_signal(signals, "model")
    name = model.value if model.known else labels.get(GPU_PRODUCT_LABEL)
    active = get_signal(signals, "nvlink_active_links")
    ecc = get_signal(signals, "ecc_mode")
    ecc_state = ("on" if ecc.value else "off") if ecc.known else "n/a" if ecc.na else "unknown"
    family, nvlink, features = _expected(
        name if isinstance(name, str) else None,
        f"{name or 'this GPU'}",
        get_signal(signals, "mig_mode").value is True,
        ecc_state,
        active.known and active.value == 0,
    )
    out: Signals = {"nvlink_links_down": _links_down(active, signals, family, nvlink)}
    for names, present, why, not_applicable in features:
        for name_ in names:
            signal = signals.get(name_)
            if signal is not None and signal.reason is None:
                continue
            if present is False:
                out[name_] = not_applicable
            elif signal is not None and signal.na:
                out[name_] = _apply(signal, present, why)
    return out


Feature = tuple[tuple[str, ...], bool, str, Signal]  # signals, present, why, the not-applicable signal


@functools.lru_cache(maxsize=1024)
def _expected(
    name: str | None, what: str, mig: bool, ecc: str, no_links: bool
) -> tuple[GpuFamily | None, tuple[bool | None, str], tuple[Feature, ...]]:
    """What a GPU of this identity and set-up has: its family, whether it has NVLink (and why), and
    each feature the identity can tell. One fleet has a handful of these, so they are made once."""
    family = family_of(name)
    nvlink = _has_nvlink(family, no_links, what)
    features = {
        NVLINK_RATES: nvlink,
        ECC_SIGNALS: _has_ecc(ecc, what),
        REMAP_SIGNALS: _has_row_remapping(family, mig, what),
        RETIREMENT_SIGNALS: _has_page_retirement(family, ecc, what),
    }
    told = [(names, *answer, Signal.not_applicable(answer[1])) for names, answer in features.items()]
    return family, nvlink, tuple(feature for feature in told if feature[1] is not None)


def _apply(signal: Signal, present: bool | None, why: str) -> Signal:
    """``signal`` judged against whether the hardware has it (None: the identity cannot tell)."""
    if signal.known or present is None:
        return signal
    if present is False:
        return Signal.not_applicable(why)
    if signal.na:  # the hardware has it, NVML says it does not
        return Signal.unknown(f"{signal.reason}, but {why}: check the driver (nvidia-smi -q) on the node")
    return signal


def _has_nvlink(family: GpuFamily | None, no_links: bool, what: str) -> tuple[bool | None, str]:
    """``no_links``: NVML knows the GPU's active link count, and it is 0."""
    if family is None:
        return None, ""
    if family.nvlink == "none":
        return False, f"{what} has no NVLink"
    if family.nvlink == "bridge" and no_links:
        return False, f"{what} has no NVLink bridge fitted (every link inactive)"
    return True, f"{what} has {family.nvlink_links} NVLink links"


def _has_ecc(ecc: str, what: str) -> tuple[bool | None, str]:
    """``ecc``: the ECC mode NVML read, ``on`` or ``off``, else ``n/a`` (not supported) or ``unknown``."""
    if ecc == "on":
        return True, "ECC is enabled on it"
    if ecc == "off":
        return False, f"ECC is disabled on {what} (nvmlDeviceGetEccMode)"
    if ecc == "n/a":
        return False, f"{what} has no ECC (nvmlDeviceGetEccMode: Not Supported)"
    return None, ""


def _has_row_remapping(family: GpuFamily | None, mig: bool, what: str) -> tuple[bool | None, str]:
    if mig:
        return (
            False,
            "MIG is enabled: NVML does not report row remapping on MIG-enabled GPUs with active instances",
        )
    if family is None:
        return None, ""
    if family.row_remapping:
        return True, f"{what} ({family.architecture}) remaps rows"
    return False, f"{what} ({family.architecture}) retires pages instead of remapping rows"


def _has_page_retirement(family: GpuFamily | None, ecc: str, what: str) -> tuple[bool | None, str]:
    if family is None:
        return None, ""
    if family.row_remapping:
        return False, f"{what} ({family.architecture}) remaps rows instead of retiring pages"
    if ecc == "off":
        return False, f"ECC is disabled on {what}: no pages are retired"
    return True, f"{what} ({family.architecture}) retires pages"


def _links_down(
    active: Signal, signals: Signals, family: GpuFamily | None, nvlink: tuple[bool | None, str]
) -> Signal:
    """Links the product should have active but has not (NVML's inactive count for an unknown product)."""
    inactive = get_signal(signals, "nvlink_inactive_links")
    if family is None:
        return inactive
    present, why = nvlink
    if present is False:
        if family.nvlink == "none" and active.known and active.value > 0:
            return inactive  # NVML knows links the catalog does not: trust NVML
        return Signal.not_applicable(why)
    if not active.known:
        return _apply(active, True, why)
    return Signal(max(0, family.nvlink_links - active.value))


def _slowdown(node: Mapping[str, Any] | None, now: float, window_s: float) -> Signals:
    """``slowdown_pct``: how much slower than its run's median a training run last saw the node, while
    that was within the fault window (``slowdown.record`` keeps it on the node); else 0."""
    if node is None:
        return {"slowdown_pct": Signal.not_applicable("no Node object (the probe judging itself)")}
    found = recorded((node.get("metadata") or {}).get("annotations"))
    if found is None or found.at < now - window_s:
        return {"slowdown_pct": Signal(0.0)}
    return {"slowdown_pct": Signal(found.pct_slower), "slowdown_pct_at": Signal(found.at)}


# -- GPU count ----------------------------------------------------------------------------------------


def _gpus_missing(report: HealthReport, node: Mapping[str, Any] | None, gpus: dict[str, Signals]) -> Signal:
    """How many fewer GPUs (or MIG devices) the probe sees than the node advertises."""
    seen = get_signal(report.signals, "gpu_count")
    if not seen.known:
        return seen
    if node is None:
        return Signal.not_applicable("no Node object to compare with (the probe judging itself)")
    status, labels = node.get("status") or {}, _labels(node)
    strategy = labels.get(MIG_STRATEGY_LABEL)
    mig_resources = [
        key
        for key in {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
        if MIG_RESOURCE.fullmatch(key)
    ]
    if strategy in ("single", "mixed") or mig_resources:
        units = _units(report)
        if not units.known:
            return units
        advertised = [
            _sum_counts(status.get(part) or {}, [GPU_RESOURCE, *mig_resources])
            for part in ("capacity", "allocatable")
        ]
        if strategy == "single":
            advertised.append(_count(labels.get(GPU_COUNT_LABEL)))
        expected = max((n for n in advertised if n is not None), default=None)
        what = f"MIG devices and GPUs ({GPU_RESOURCE} + nvidia.com/mig-*, strategy {strategy or 'unset'})"
        if expected is None:
            return Signal.unknown(f"the node advertises no {what}")
        return Signal(max(0, expected - units.value))
    found = [
        _count((status.get("capacity") or {}).get(GPU_RESOURCE)),
        _count((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        _count(labels.get(GPU_COUNT_LABEL)),
    ]
    counts = [n for n in found if n is not None]
    if not counts:
        return Signal.unknown(f"the node has no {GPU_RESOURCE} capacity and no {GPU_COUNT_LABEL} label")
    return Signal(max(0, max(counts) - seen.value))


def _unjudged_ethernet(key: str, signals: Signals, shortfall: Signal, fabric: Fabric) -> Signals:
    """A down or slower Ethernet port of an undescribed fabric: unknown, naming what tells (the HCAs)."""
    fix = (
        f"a RoCE fabric port, or a NIC beside the fabric? Name the fabric's HCAs as NCCL_IB_HCA does "
        f"(fabrics: {{{fabric.name!r}: {{'hcas': 'mlx5_0,mlx5_1,...'}}}}, or 'rate_gbps') to judge it"
    )
    out: Signals = {}
    if get_signal(signals, "ib_state").value != "ACTIVE":
        out["ib_state"] = out["ib_phys_state"] = Signal.unknown(f"Ethernet port {key} is down: {fix}")
    if fabric.rate_gbps is None and shortfall.known and shortfall.value > 0:
        out["ib_rate_shortfall_gbps"] = Signal.unknown(
            f"Ethernet port {key} is slower than the node's others: {fix}"
        )
    return out


def _units(report: HealthReport) -> Signal:
    """What the device plugin would advertise from what NVML sees: each MIG device, each GPU without MIG."""
    total = 0
    for signals in report.gpus.values():
        if get_signal(signals, "mig_mode").value is True:
            devices = get_signal(signals, "mig_devices")
            if not devices.known:
                return devices
            total += devices.value
        elif get_signal(signals, "gpu_lost").value is not True:
            total += 1
    return Signal(total)


def family(report: HealthReport, node: Mapping[str, Any] | None) -> str:
    """The node's GPU family (catalog key), else the product name NVML or GFD gives, else ""."""
    names = [get_signal(s, "model").value for s in report.gpus.values()] + [
        _labels(node).get(GPU_PRODUCT_LABEL)
    ]
    for name in names:
        if found := family_of(name):
            return found.key
    return next((name for name in names if isinstance(name, str) and name), "")


def clock_under_load(signals: Signals) -> Signal:
    """The SM clock as a percentage of its maximum while the GPU is busy and the hardware holds it
    down (``THROTTLE_BITS``); 100 while busy and not held down. Not applicable while idle: clocks
    drop at idle by design, so they are judged only under load (inference or training)."""
    utilization, processes = get_signal(signals, "utilization_pct"), get_signal(signals, "running_processes")
    if utilization.known:
        busy = utilization.value >= BUSY_UTILIZATION_PCT
    elif processes.known:  # MIG: no utilization on the parent GPU; its MIG devices' processes instead
        busy = processes.value > 0
    else:
        return utilization
    if not busy:
        return Signal.not_applicable("GPU idle: its clocks are judged under load")
    reasons = get_signal(signals, "clock_event_reasons")
    if not reasons.known:
        return reasons
    if not int(reasons.value) & THROTTLE_BITS:
        return Signal(100.0)
    clock, ceiling = get_signal(signals, "sm_clock_mhz"), get_signal(signals, "sm_clock_max_mhz")
    if not (clock.known and ceiling.known and ceiling.value > 0):
        return clock if not clock.known else ceiling
    return Signal(round(100.0 * clock.value / ceiling.value, 1))


def compared_with_node(report: HealthReport) -> list[Any]:
    """What only the gate judges, against the Node object the probe does not read: its GPU and MIG
    device counts and which RDMA ports it has on which link layer. A probe that writes on change
    must also write when these change (see ``published.report_digest``)."""
    units = _units(report)
    ports = sorted((key, get_signal(s, "ib_link_layer").value) for key, s in report.ib_ports.items())
    return [get_signal(report.signals, "gpu_count").value, units.value, ports]


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and COUNT.fullmatch(value) else None


def _sum_counts(resources: Mapping[str, Any], keys: list[str]) -> int | None:
    counts = [_count(resources.get(key)) for key in keys]
    known = [n for n in counts if n is not None]
    return sum(known) if known else None


# -- fabric ---------------------------------------------------------------------------------------


def _fabric(
    report: HealthReport, labels: Mapping[str, str], fabric: Fabric | None, why: str
) -> tuple[dict[str, Signals], Signals]:
    """Per port: not applicable unless it is a fabric port, the rate shortfall if it is; per node the
    fabric's port count and how many it lacks."""
    if fabric is None:
        unknown = Signal.unknown(why)
        return {key: dict.fromkeys(PORT_SIGNALS, unknown) for key in report.ib_ports}, {
            "fabric_ports": unknown,
            "ib_ports_missing": unknown,
        }
    if not fabric.required:
        na = Signal.not_applicable(f"{fabric.describe()}: {why}")
        return {key: dict.fromkeys(PORT_SIGNALS, na) for key in report.ib_ports}, {
            "fabric_ports": na,
            "ib_ports_missing": na,
        }
    listed = get_signal(report.signals, "ib_port_count")
    if not listed.known:
        unknown = Signal.unknown(
            f"{listed.reason}: {fabric.describe()} needs RDMA ports ({why}); if this node's pool trains "
            f"without RDMA, label it trainops.io/fabric=none"
        )
        return {}, {"fabric_ports": unknown, "ib_ports_missing": unknown}
    layer = fabric.link_layer
    if layer == "auto":
        layers = {get_signal(s, "ib_link_layer").value for s in report.ib_ports.values()}
        layer = "InfiniBand" if "InfiniBand" in layers else "Ethernet"
    chosen: dict[str, Signals] = {}
    ports: dict[str, Signals] = {}
    for key, signals in report.ib_ports.items():
        device, _, port = key.rpartition("/")
        link_layer = get_signal(signals, "ib_link_layer")
        reason = None
        if link_layer.known and link_layer.value != layer:
            reason = f"not a port of {fabric.describe()}: {link_layer.value} link layer"
        elif not fabric.selects(device, int(port) if port.isdigit() else 0):
            reason = f"not a port of {fabric.describe()}: not in its HCA list"
        if reason:
            ports[key] = dict.fromkeys(PORT_SIGNALS, Signal.not_applicable(reason))
        else:
            chosen[key] = signals
    rates = [s["ib_rate_gbps"].value for s in chosen.values() if get_signal(s, "ib_rate_gbps").known]
    expected = fabric.rate_gbps or (max(rates) if rates else None)
    # Ethernet ports of a fabric nobody described: a RoCE fabric's, or a storage NIC's beside it? A port
    # down or slower than the others is then a question to answer with the fabric's HCAs, not a fault.
    guessed = fabric.link_layer == "auto" and not fabric.hcas and layer == "Ethernet"
    for key, signals in chosen.items():
        rate = get_signal(signals, "ib_rate_gbps")
        shortfall = Signal(max(0.0, expected - rate.value)) if rate.known else rate
        ports[key] = {"ib_rate_shortfall_gbps": shortfall}
        if guessed:
            ports[key].update(_unjudged_ethernet(key, signals, shortfall, fabric))
    wanted = fabric.ports or _count(labels.get(IB_PORT_COUNT_LABEL))
    if guessed and wanted is None:  # a port that is down may be one of them: count those that are up
        chosen = {key: s for key, s in chosen.items() if get_signal(s, "ib_state").value == "ACTIVE"}
    missing = (
        Signal(max(0, wanted - len(chosen)))
        if wanted
        else Signal.not_applicable(
            f"no port count to compare with ({fabric.name!r} sets none, no {IB_PORT_COUNT_LABEL} label)"
        )
    )
    return ports, {"fabric_ports": Signal(len(chosen)), "ib_ports_missing": missing}
