"""XIDs as NVIDIA catalogs them, and what the gate does about each.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html), its "Immediate Action" column, as mirrored machine-readably in
leptonai/gpud ``components/accelerator/nvidia/xid/catalog_generated.go`` (generated 2025-10-29
from the catalog; the NVLink5 XIDs 144-150 there per sub-unit and error status).

Buckets the policy uses (rows ``xid_fatal``, ``xid_undecoded``, ``xid_warn``):

* **fatal** (quarantine): the catalog says reset the GPU (RESET_GPU), power-cycle the machine
  (RESTART_BM), follow an ECC/NVLink workflow that ends in a reset (WORKFLOW_XID_48,
  WORKFLOW_NVLINK_ERR), or replace the VM (RESTART_VM). This includes 109 (context-switch timeout;
  NVIDIA's device plugin marks the GPU unhealthy on it) and 110 (security fault), and 150 (MSE
  watchdog: every sub-code RESET_GPU).
* **undecoded** (exclude from this run, no quarantine): 144 (SAW), 146 (TLW) and 149 (NETIR) are
  RESET_GPU for some sub-codes and IGNORE for others. The sub-code is only in the kernel log's
  XID message; NVML's event and dcgm-exporter's gauge carry the XID number alone. The documented
  conservative choice: keep the node out of the run it would be chosen for (for the XID lookback
  window), without tainting it, since most of their sub-codes are IGNORE; a fatal sub-code comes
  with a companion the gate does act on (XID 48, 45/154 with a recovery action, NVLink links down).
* **warn**: the catalog's RESTART_APP (the application's fault, e.g. 13, 31, 43, 94) and a few
  IGNORE ones worth showing (63 row-remap event, 92 high single-bit rate); 145 (RLW) asks to read
  the recovery action (XID_154_EVAL), which the ``recovery_action`` row does.
* ignored: IGNORE (147 TREX and 148 NVLPW_CTRL: every sub-code IGNORE), 45 (follows another XID),
  154 (the recovery action changed: the ``recovery_action`` row reads it).

An XID not in this table is shown as a warning, never silently passed.
"""

from __future__ import annotations

# code: (catalog description, immediate action)
CATALOG: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", "RESTART_APP"),
    13: ("Graphics Engine Exception", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    32: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    38: ("Driver firmware error", "IGNORE"),
    43: ("GPU stopped processing", "IGNORE"),
    45: ("Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    46: ("GPU stopped processing", "RESET_GPU"),
    48: ("Double Bit ECC Error", "WORKFLOW_XID_48"),
    61: ("Internal micro-controller breakpoint/warning", "CONTACT_SUPPORT"),
    62: ("Internal micro-controller halt", "RESET_GPU"),
    63: ("GPU memory remapping event", "IGNORE"),
    64: ("GPU memory remapping failure", "RESET_GPU"),
    68: ("NVDEC0 Exception", "RESTART_APP"),
    69: ("Graphics Engine class error", "RESTART_APP"),
    74: ("NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    92: ("High single-bit ECC error rate", "IGNORE"),
    94: ("Contained memory error", "RESTART_APP"),
    95: ("Uncontained memory error", "RESET_GPU"),
    109: ("Context Switch Timeout Error", "RESET_GPU"),
    110: ("Security Fault Error", "RESET_GPU"),
    119: ("GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP Error", "RESET_GPU"),
    121: ("C2C Error", "IGNORE"),
    136: ("Link Training Failed", "RESET_GPU"),
    137: ("NVLink Privilege Error", "IGNORE"),
    140: ("ECC Unrecovered Error", "RESET_GPU"),
    143: ("GPU Initialization Error", "RESET_GPU"),
    144: ("NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    151: ("Key rotation Error", "RESTART_VM"),
    154: ("GPU Recovery Action Changed", "XID_154"),
    155: ("NVLINK: SW Defined Error", "RESET_GPU"),
    156: ("Resource Retirement Event", "RESET_GPU"),
    157: ("Resource Retirement Failure", "IGNORE"),
    158: ("GPU Fatal Timeout", "RESET_GPU"),
}
FATAL_ACTIONS = ("RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR")
IGNORED_ACTIONS = ("IGNORE", "WORKFLOW_XID_45", "XID_154")
SHOWN_IGNORES = (63, 92)  # IGNORE in the catalog, but worth a warning (memory wearing out)

FATAL = sorted(
    [code for code, (_, action) in CATALOG.items() if action in FATAL_ACTIONS] + [150]
)  # 150: MSE watchdog
UNDECODED = [144, 146, 149]  # NVLink5: fatal or ignorable by sub-code (in the kernel log only)
IGNORED = sorted(
    [code for code, (_, action) in CATALOG.items() if action in IGNORED_ACTIONS and code not in SHOWN_IGNORES]
    + [147, 148]  # NVLink5 TREX, NVLPW_CTRL: every sub-code IGNORE
)
# The rest warns: RESTART_APP and CONTACT_SUPPORT, 63 and 92, 145 (XID_154_EVAL) and any code not here.
NOT_WARNED = sorted(FATAL + UNDECODED + IGNORED)


def describe(code: int) -> str:
    """``"XID 79 (GPU has fallen off the bus; catalog: RESTART_BM)"``."""
    meaning, action = CATALOG.get(code, ("not in trainops' XID table", "unknown"))
    return f"XID {code} ({meaning}; catalog: {action})"
