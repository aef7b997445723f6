"""Node profiles: which GPUs and which fabric each simulated node has, and what its NVML and sysfs answer.

A :class:`NodeProfile` names a GPU family of the product's catalog (``trainops.health.hardware``:
what the family has) plus how this node is set up (GPU count, ECC mode, NVLink bridge, MIG) and a
fabric (``FABRICS``: the RDMA ports under ``/sys/class/infiniband``). :class:`GpuSpec` holds what the
simulation needs beyond the catalog (NVML's product name, GFD's label, power, clocks, PCIe, a
plausible GEMM speed). ``telemetry.NodeTelemetry.from_profile`` boots a node from a profile, and the
fake NVML answers where and how the real one does (``telemetry.FakeNvml``, sources there).

A fleet is a list of profiles, or a spec string (``trainops devcluster up --fleet``)::

    parse_fleet("6*h100-sxm/ib-ndr, 2*l40s/roce-200+eth, a100-sxm:mig=1g.10gb/none")

Each entry: ``[COUNT*]GPU[:OPTION=VALUE...]/FABRIC[+eth]``; options: ``gpus`` (per node), ``ecc``
(on/off), ``bridge`` (on/off, bridge-capable PCIe cards), ``mig`` (a profile such as ``1g.10gb``:
every GPU split into as many instances of it as fit), ``strategy`` (``single``/``mixed``, GFD's MIG
strategy), ``pool`` (the node's ``trainops.io/fabric`` label, e.g. ``none`` for a pool that needs no
RDMA). ``+eth`` adds an Ethernet-mode NIC beside the fabric (one port up for storage, one unused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainops.health.hardware import BY_KEY, GpuFamily


@dataclass(frozen=True)
class GpuSpec:
    """Simulation facts of one family (datasheet values; ``gemm_tflops`` a plausible measured dense GEMM)."""

    nvml_name: str  # nvmlDeviceGetName
    gfd_product: str  # GFD's nvidia.com/gpu.product
    memory_mib: int  # GFD's nvidia.com/gpu.memory: NVML's total memory per GPU, as nvidia-smi shows it
    power_limit_w: float
    max_sm_clock_mhz: int
    pcie_gen: int
    gemm_tflops: float
    mig_profile_instances: tuple[tuple[str, int], ...] = ()  # (MIG profile, instances per GPU)
    pcie_width: int = 16
    memory_max_temp_c: int = 95


# fmt: off
GPUS: dict[str, GpuSpec] = {
    "h100-sxm":  GpuSpec("NVIDIA H100 80GB HBM3",  "NVIDIA-H100-80GB-HBM3",  81559,   700, 1980, 5, 720, (("1g.10gb", 7), ("3g.40gb", 2), ("7g.80gb", 1))),
    "h200-sxm":  GpuSpec("NVIDIA H200",            "NVIDIA-H200",            143771,  700, 1980, 5, 745, (("1g.18gb", 7), ("7g.141gb", 1))),
    "h100-pcie": GpuSpec("NVIDIA H100 PCIe",       "NVIDIA-H100-PCIe",       81559,   350, 1755, 5, 510, (("1g.10gb", 7),)),
    "h100-nvl":  GpuSpec("NVIDIA H100 NVL",        "NVIDIA-H100-NVL",        95830,   400, 1785, 5, 600, (("1g.12gb", 7),)),
    "b200":      GpuSpec("NVIDIA B200",            "NVIDIA-B200",            183359, 1000, 1965, 5, 1600, (("1g.23gb", 7),)),
    "l40s":      GpuSpec("NVIDIA L40S",            "NVIDIA-L40S",            46068,   350, 2520, 4, 250),
    "l4":        GpuSpec("NVIDIA L4",              "NVIDIA-L4",              23034,    72, 2040, 4, 85),
    "a100-pcie": GpuSpec("NVIDIA A100 80GB PCIe",  "NVIDIA-A100-80GB-PCIe",  81920,   300, 1410, 4, 215, (("1g.10gb", 7),)),
    "a100-sxm":  GpuSpec("NVIDIA A100-SXM4-80GB",  "NVIDIA-A100-SXM4-80GB",  81920,   400, 1410, 4, 225, (("1g.10gb", 7), ("3g.40gb", 2), ("7g.80gb", 1))),
    "v100-sxm2": GpuSpec("Tesla V100-SXM2-32GB",   "Tesla-V100-SXM2-32GB",   32768,   300, 1530, 3, 95),
    "t4":        GpuSpec("Tesla T4",               "Tesla-T4",               15360,    70, 1590, 3, 45),
}
# fmt: on


@dataclass(frozen=True)
class PortSpec:
    """One RDMA port as sysfs shows it (kernel ABI sysfs-class-infiniband): ``link_layer`` is
    ``InfiniBand`` or ``Ethernet`` (RoCE and Ethernet-mode NICs), ``rate`` the kernel's text."""

    device: str
    port: int
    link_layer: str
    rate: str
    up: bool = True


def _ports(count: int, link_layer: str, rate: str, first: int = 0) -> tuple[PortSpec, ...]:
    return tuple(PortSpec(f"mlx5_{i}", 1, link_layer, rate) for i in range(first, first + count))


# sysfs rate texts: the kernel prints "<Gb/s> Gb/sec (<width> <speed>)"; RoCE ports map their
# Ethernet speed onto the IB speed names (400GbE: 4X NDR, 200GbE: 4X HDR, 100GbE: 4X EDR).
FABRICS: dict[str, tuple[PortSpec, ...]] = {
    "ib-ndr": _ports(8, "InfiniBand", "400 Gb/sec (4X NDR)"),
    "ib-hdr": _ports(8, "InfiniBand", "200 Gb/sec (4X HDR)"),
    "roce-400": _ports(8, "Ethernet", "400 Gb/sec (4X NDR)"),
    "roce-200": _ports(8, "Ethernet", "200 Gb/sec (4X HDR)"),
    "roce-100": _ports(4, "Ethernet", "100 Gb/sec (4X EDR)"),
    "none": (),  # no RDMA driver: /sys/class/infiniband does not exist
}
# An Ethernet-mode ConnectX beside the fabric: one port carries storage traffic, the other is unused.
STORAGE_NIC = (
    PortSpec("mlx5_8", 1, "Ethernet", "100 Gb/sec (4X EDR)"),
    PortSpec("mlx5_9", 1, "Ethernet", "10 Gb/sec (4X SDR)", up=False),
)


@dataclass(frozen=True)
class NodeProfile:
    """One node's hardware. ``gpus`` None: 8. ``ecc`` None: the family's default. ``bridge``: an NVLink
    bridge on bridge-capable PCIe cards. ``mig``: a MIG profile every GPU is split into (``strategy``
    as GFD advertises it). ``pool``: the node's ``trainops.io/fabric`` label (None: no label)."""

    gpu: str = "h100-sxm"
    fabric: str = "ib-ndr"
    gpus: int | None = None
    ecc: bool | None = None
    bridge: bool = False
    mig: str | None = None
    strategy: str = "single"
    storage_nic: bool = False
    pool: str | None = None
    ports: tuple[PortSpec, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.gpu not in GPUS or self.gpu not in BY_KEY:
            raise ValueError(f"unknown GPU family {self.gpu!r}; known: {', '.join(GPUS)}")
        if self.fabric not in FABRICS:
            raise ValueError(f"unknown fabric {self.fabric!r}; known: {', '.join(FABRICS)}")
        if self.gpus is not None and not 1 <= self.gpus <= 16:
            raise ValueError(f"gpus must be in 1..16, got {self.gpus}")
        if self.strategy not in ("single", "mixed"):
            raise ValueError(f"strategy must be single or mixed, got {self.strategy!r}")
        if self.mig is not None:
            if not self.family.mig:
                raise ValueError(f"{self.gpu} does not support MIG")
            if self.mig not in dict(self.spec.mig_profile_instances):
                known = ", ".join(p for p, _ in self.spec.mig_profile_instances)
                raise ValueError(f"MIG profile {self.mig!r} is not one of {self.gpu}'s: {known}")
        if self.bridge and self.family.nvlink != "bridge":
            raise ValueError(f"{self.gpu} takes no NVLink bridge (its NVLink is {self.family.nvlink!r})")
        object.__setattr__(self, "ports", FABRICS[self.fabric] + (STORAGE_NIC if self.storage_nic else ()))

    @property
    def family(self) -> GpuFamily:
        return BY_KEY[self.gpu]

    @property
    def spec(self) -> GpuSpec:
        return GPUS[self.gpu]

    @property
    def gpu_count(self) -> int:
        return self.gpus or 8

    @property
    def ecc_on(self) -> bool:
        return self.family.ecc_default if self.ecc is None else self.ecc

    @property
    def mig_instances(self) -> int:
        """MIG devices per GPU (0 with MIG off)."""
        return dict(self.spec.mig_profile_instances)[self.mig] if self.mig else 0

    @property
    def device_memory_mib(self) -> int:
        """GFD's ``nvidia.com/gpu.memory``: a GPU's memory, or under the single MIG strategy a MIG device's
        (its profile's size, e.g. 10 GiB for ``1g.10gb``; the real label is a little less)."""
        if self.mig and self.strategy == "single":
            return int(re.search(r"\.(\d+)gb$", self.mig).group(1)) * 1024
        return self.spec.memory_mib

    def describe(self) -> str:
        """The profile as a fleet-spec entry (``parse_fleet`` reads it back)."""
        options = [f"gpus={self.gpus}"] if self.gpus else []
        options += [f"ecc={'on' if self.ecc else 'off'}"] if self.ecc is not None else []
        options += ["bridge=on"] if self.bridge else []
        options += [f"mig={self.mig}", f"strategy={self.strategy}"] if self.mig else []
        options += [f"pool={self.pool}"] if self.pool else []
        return ":".join([self.gpu, *options]) + f"/{self.fabric}" + ("+eth" if self.storage_nic else "")


_ENTRY = re.compile(r"^(?:(\d+)\*)?([a-z0-9-]+)((?::[a-z]+=[A-Za-z0-9._-]+)*)/([a-z0-9-]+)(\+eth)?$")


def parse_fleet(spec: str) -> list[NodeProfile]:
    """Profiles from a fleet spec (see the module docstring); ValueError names the bad entry."""
    fleet: list[NodeProfile] = []
    for entry in (part.strip() for part in spec.split(",")):
        match = _ENTRY.match(entry)
        if not match:
            raise ValueError(
                f"fleet entry {entry!r}: expected [COUNT*]GPU[:OPTION=VALUE...]/FABRIC[+eth], "
                "e.g. 4*h100-sxm/ib-ndr or l40s:ecc=off/roce-200+eth"
            )
        count, gpu, options, fabric, eth = match.groups()
        fields: dict = {"gpu": gpu, "fabric": fabric, "storage_nic": bool(eth)}
        for option in filter(None, options.split(":")):
            key, value = option.split("=", 1)
            fields.update(_option(entry, key, value))
        try:
            profile = NodeProfile(**fields)
        except ValueError as error:
            raise ValueError(f"fleet entry {entry!r}: {error}") from None
        fleet += [profile] * int(count or 1)
    return fleet


def _option(entry: str, key: str, value: str) -> dict:
    switches = {"on": True, "off": False}
    if key == "gpus" and value.isdigit():
        return {"gpus": int(value)}
    if key in ("ecc", "bridge") and value in switches:
        return {key: switches[value]}
    if key in ("mig", "strategy", "pool"):
        return {key: value}
    raise ValueError(
        f"fleet entry {entry!r}: bad option {key}={value} (gpus=N, ecc=on|off, bridge=on|off, "
        "mig=PROFILE, strategy=single|mixed, pool=LABEL)"
    )


def homogeneous(nodes: int, gpus: int = 8) -> list[NodeProfile]:
    """``nodes`` HGX H100 nodes with NDR InfiniBand (the devcluster's default fleet)."""
    return [NodeProfile(gpus=gpus)] * nodes


# The demo's fleet: six families on five fabrics (a storage NIC beside HDR InfiniBand), and two
# inference-pool nodes without RDMA, one of them split into MIG devices.
DEMO_FLEET = (
    "6*h100-sxm/ib-ndr, 2*h200-sxm/ib-ndr, 2*a100-sxm/ib-hdr+eth, 2*l40s/roce-200, h100-nvl/roce-400, "
    "a100-sxm:mig=1g.10gb:pool=none/none, t4:pool=none/none, h100-sxm/ib-ndr"
)
