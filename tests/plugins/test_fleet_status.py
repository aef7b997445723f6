"""The fleet reads each node's verdict against its mode: a node busy doing its mode's work is not a
warning; what is left needs a person. Plain rows, as the node probe's summary writes them."""

from __future__ import annotations

import pytest
from trainops.plugins.fleet import findings, node_status

IN_USE = "gpu_in_use [gpu 0, gpu 1, gpu 2, gpu 3, gpu 4, gpu 5, gpu 6, gpu 7] processes on the GPU (drained later): running_processes=1 (> 0)"
BUSY = "tensor_busy [gpu 0, gpu 1] tensor cores busy: tensor_active=0.4 (> 0.05)"
HOT = "thermal_warn [gpu 3] GPU running hot: temperature_c=88 (>= 85)"
MORE = "(+2 more in the report)"


@pytest.mark.parametrize(
    "health, mode, reasons, quarantined, status",
    [
        ("warn", "inference", [IN_USE], False, "serving"),  # the inference server on its GPUs
        ("warn", "inference", [IN_USE, BUSY], False, "serving"),
        ("ok", "inference", [], False, "serving"),
        ("warn", "training", [IN_USE, BUSY], False, "training"),
        ("ok", "none", [], False, "idle"),
        ("warn", "none", [IN_USE], False, "warn"),  # processes on a GPU node nobody manages
        ("warn", "inference", [IN_USE, HOT], False, "warn"),  # serving, and running hot: a person looks
        ("warn", "inference", [IN_USE, MORE], False, "warn"),  # what the summary left out may be anything
        ("exclude", "inference", ["report_age [node] health report is stale: ..."], False, "excluded"),
        ("quarantine", "inference", ["xid_fatal [gpu 2] fatal XID ..."], False, "failing"),
        ("quarantine", "inference", ["xid_fatal [gpu 2] fatal XID ..."], True, "quarantined"),
        ("ok", "inference", [], True, "quarantined"),  # quarantined by hand: released only after a re-check
        ("unknown", "inference", ["no health summary on the node"], False, "unknown"),
    ],
)
def test_status_reads_the_verdict_against_the_mode(health, mode, reasons, quarantined, status):
    assert node_status(health, mode, findings(reasons, mode), quarantined) == status


def test_findings_name_their_rows_and_every_target_once_and_mark_the_modes_work_expected():
    found = findings([IN_USE, HOT, "a reason in no known form"], "inference")

    assert found[0] == {
        "rows": ["gpu_in_use"],
        "targets": [f"gpu {i}" for i in range(8)],
        "text": "processes on the GPU (drained later): running_processes=1 (> 0)",
        "expected": True,
    }
    assert found[1]["rows"] == ["thermal_warn"] and not found[1]["expected"]
    assert found[2] == {"rows": [], "targets": [], "text": "a reason in no known form", "expected": False}
