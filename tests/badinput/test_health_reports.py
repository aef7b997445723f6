"""Issue 15: one node's malformed health report is a reason for that node, never an error for the gate."""

from __future__ import annotations

import json

import pytest

from trainops.health.published import read_report
from trainops.health.report import MAX_REPORT_CHARS, HealthReport

GOOD = {"schema_version": 1, "node": "gpu-1", "collected_at": 1.0, "source": "probe"}

BAD_REPORTS = {
    "gpus-a-list": ({**GOOD, "gpus": [{"xid": {"value": 0}}]}, "gpus must be an object keyed by gpu"),
    "gpus-a-string": ({**GOOD, "gpus": "eight"}, "gpus must be an object keyed by gpu"),
    "ib-ports-a-list": ({**GOOD, "ib_ports": [1]}, "ib_ports must be an object"),
    "signals-a-list": ({**GOOD, "signals": [{"value": 1}]}, "signals must map names to {value, reason}"),
    "signals-a-string": ({**GOOD, "signals": "ok"}, "signals must map names to {value, reason}"),
    "a-gpu-signal-a-number": ({**GOOD, "gpus": {"0": {"xid": 5}}}, "gpus['0'] must map names"),
    "node-a-number": ({**GOOD, "node": 7}, "node and source must be strings"),
    "report-a-list": ([GOOD], "must be a JSON object, not list"),
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "over-1-mib": ({**GOOD, "source": "x" * MAX_REPORT_CHARS}, "over the 1048576 limit"),
}


@pytest.mark.parametrize("report, message", BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
def test_a_malformed_report_reads_as_a_node_that_knows_nothing(report, message):
    text = report if isinstance(report, str) else json.dumps(report)
    with pytest.raises(ValueError, match="health report") as error:
        HealthReport.from_json(text)
    assert message in str(error.value)

    read = read_report({"data": {"report.json": text}}, "gpu-1", now=5.0)

    assert read.node == "gpu-1" and read.gpus == {} and not read.signals["gpu_count"].known
    assert message in read.signals["gpu_count"].reason
