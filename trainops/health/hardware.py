"""What each GPU family has, so the policy can tell "this hardware does not have it" from "could not read it".

The catalog is data: one :class:`GpuFamily` per product family, matched by the name NVML reports
(``nvmlDeviceGetName``), dcgm-exporter's ``modelName`` label, or GPU Feature Discovery's
``nvidia.com/gpu.product`` label (which adds ``-MIG-<profile>`` under the ``single`` MIG strategy).
A GPU the catalog does not know is judged by NVML's own answers alone (``NOT_SUPPORTED`` reads as
not applicable), so a new product never fails for being new.

Sources (NVIDIA):

* NVML API reference, Device Queries (docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html):
  ``nvmlDeviceGetRemappedRows`` "For Ampere or newer fully supported devices"; "On MIG-enabled GPUs
  with active instances, querying the number of remapped rows is not supported".
  ``nvmlDeviceGetTotalEccErrors`` "Only applicable to devices with ECC ... Requires ECC Mode to be
  enabled". ``nvmlDeviceGetComputeRunningProcesses`` "In MIG mode, if device handle is provided, the
  API returns aggregate information, only if the caller has appropriate privileges".
  ``nvmlDeviceGetUtilizationRates`` "On MIG-enabled GPUs, querying device utilization rates is not
  currently supported". ``nvmlDeviceGetMigMode`` "For Ampere or newer fully supported devices".
* GPU memory error management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/): row remapping on
  A100 and later replaces the dynamic page retirement of earlier GPUs (Volta, Turing), whose NVML
  queries are ``nvmlDeviceGetRetiredPages``/``...PendingStatus``; Ada (L40S, L4) remaps rows too.
* NVLink per product: Volta V100 whitepaper (6 NVLink 2 links, 300 GB/s), Ampere A100 whitepaper
  (12 NVLink 3 links, 600 GB/s), Hopper H100 whitepaper (18 NVLink 4 links, 900 GB/s on SXM),
  Blackwell B200 datasheet (18 NVLink 5 links, 1.8 TB/s). H100 PCIe and H100 NVL reach 600 GB/s
  only through NVLink bridges (datasheets): 12 links (600 GB/s at 50 GB/s per NVLink 4 link), all
  answered by NVML as present but inactive when no bridge is fitted (NVSentinel treats unbridged
  cards so; DCGM issues #49, #198). L40S, L4 and T4 have no NVLink (datasheets: "NVLink: No").
* MIG user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide/): MIG on A100, A30, H100,
  H200, B200 and later; up to 7 instances per GPU.
* GPU Feature Discovery labels (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md):
  ``nvidia.com/mig.strategy``; under ``single`` ``nvidia.com/gpu`` and ``nvidia.com/gpu.count``
  count MIG devices; under ``mixed`` each MIG type is its own resource ``nvidia.com/mig-<type>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
NVLINK_KINDS = ("none", "bridge", "switch", "mesh")
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class GpuFamily:
    """One product family: what NVML reports for it when healthy.

    ``nvlink``: ``none`` (no NVLink silicon: NVML answers NOT_SUPPORTED), ``bridge`` (a PCIe card
    whose ``nvlink_links`` work only with an NVLink bridge fitted; unbridged, NVML answers every link
    present but inactive), ``switch`` (SXM on an NVSwitch baseboard) or ``mesh`` (SXM, GPUs linked
    directly): the last two must have every link active. ``ecc_default``: ECC on as shipped
    (HBM parts cannot turn it off). ``mig``: supports Multi-Instance GPU.
    """

    key: str
    pattern: str  # matched against the normalised product name (see ``normalise``)
    architecture: str
    form_factor: str  # sxm | pcie
    nvlink: str
    nvlink_links: int
    ecc_default: bool
    mig: bool
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{self.key}: architecture must be one of {ARCHITECTURES}")
        if self.nvlink not in NVLINK_KINDS or (self.nvlink == "none") != (self.nvlink_links == 0):
            raise ValueError(
                f"{self.key}: nvlink must be one of {NVLINK_KINDS}, with links only when not none"
            )
        re.compile(self.pattern)

    @property
    def row_remapping(self) -> bool:
        """Ampere or newer: row remapping (NVML answers it unless MIG instances are active)."""
        return ARCHITECTURES.index(self.architecture) >= ARCHITECTURES.index("ampere")

    @property
    def page_retirement(self) -> bool:
        """Volta and Turing retire pages; later GPUs remap rows instead."""
        return not self.row_remapping

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, normalise(name)) is not None


DATASHEETS = "nvidia.com/en-us/data-center (product datasheet)"
# fmt: off
CATALOG: tuple[GpuFamily, ...] = (
    #         key          pattern (normalised name)            arch         form    nvlink    links ecc    mig
    GpuFamily("h100-nvl",  r"H100-NVL",                         "hopper",    "pcie", "bridge", 12,   True,  True,  (DATASHEETS,)),
    GpuFamily("h100-pcie", r"H100-PCIE",                        "hopper",    "pcie", "bridge", 12,   True,  True,  (DATASHEETS,)),
    GpuFamily("h200-sxm",  r"H200(?!-NVL)",                     "hopper",    "sxm",  "switch", 18,   True,  True,  ("Hopper whitepaper",)),
    GpuFamily("h100-sxm",  r"H100-(SXM|80GB-HBM3)",             "hopper",    "sxm",  "switch", 18,   True,  True,  ("Hopper whitepaper",)),
    GpuFamily("b200",      r"(^|-)B200",                        "blackwell", "sxm",  "switch", 18,   True,  True,  (DATASHEETS,)),
    GpuFamily("l40s",      r"L40S",                             "ada",       "pcie", "none",   0,    False, False, (DATASHEETS,)),
    GpuFamily("l4",        r"(^|-)L4($|-)",                     "ada",       "pcie", "none",   0,    True,  False, (DATASHEETS,)),
    GpuFamily("a100-pcie", r"A100.*PCIE",                       "ampere",    "pcie", "bridge", 12,   True,  True,  ("Ampere whitepaper",)),
    GpuFamily("a100-sxm",  r"A100-SXM",                         "ampere",    "sxm",  "switch", 12,   True,  True,  ("Ampere whitepaper",)),
    GpuFamily("v100-sxm2", r"V100-SXM2",                        "volta",     "sxm",  "mesh",   6,    True,  False, ("Volta whitepaper",)),
    GpuFamily("t4",        r"(^|-)T4($|-)",                     "turing",    "pcie", "none",   0,    True,  False, (DATASHEETS,)),
)
# fmt: on
BY_KEY = {family.key: family for family in CATALOG}


def normalise(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA-H100-80GB-HBM3"``; GFD's MIG suffix is dropped
    (``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"`` -> ``"NVIDIA-A100-SXM4-40GB"``)."""
    upper = re.sub(r"[^A-Z0-9]+", "-", name.upper()).strip("-")
    return re.sub(r"-MIG-.*$", "", upper)


def family_of(name: str | None) -> GpuFamily | None:
    """The catalog entry for a product name (NVML, dcgm-exporter or GFD spelling), None if unknown."""
    if not isinstance(name, str) or not name:
        return None
    return next((family for family in CATALOG if family.matches(name)), None)
