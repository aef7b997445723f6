"""Where reports live: ConfigMap names a real API server accepts, a bounded node summary, a digest
that moves only with the verdict, a thresholded signal or the speed."""

from __future__ import annotations

import json
import re

from tests.health.conftest import two_sample_report
from trainops.health.policy import NodeVerdict, evaluate
from trainops.health.published import (
    SUMMARY_MAX_BYTES,
    configmap_name,
    read_report,
    report_configmap,
    report_digest,
    summary,
    summary_json,
)

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def test_configmap_names_fit_the_api_even_for_the_longest_node_names():
    assert configmap_name("gpu-node-001") == "node-health-gpu-node-001"
    longest = ["a" * 253, "a" * 252 + "b", ("x" * 62 + ".") * 4]
    names = [configmap_name(node[:253]) for node in longest]
    assert all(len(n) <= 253 and DNS_SUBDOMAIN.match(n) for n in names)
    assert len(set(names)) == len(names)  # two long names never share a ConfigMap


def test_the_summary_stays_small_however_many_and_long_the_reasons():
    reasons = [f"row_{i} [gpu {i}] " + "x" * 5000 for i in range(200)]
    body = summary(NodeVerdict("gpu-node-001", "quarantine", reasons), "0123456789abcdef")
    assert len(summary_json(body)) <= SUMMARY_MAX_BYTES
    assert body["verdict"] == "quarantine" and body["reasons"][0].startswith("row_0 [gpu 0] xxx")
    assert body["reasons"][-1] == "(+197 more in the report)"
    assert body["report"] == "trainops-system/node-health-gpu-node-001"


def heat(gpu, degrees: float) -> None:
    gpu.idle_temp_c += degrees
    gpu.busy_temp_c += degrees


def test_the_digest_ignores_moving_readings_and_follows_thresholds_and_speed(node, clock):
    def digest(report, speed=700.0):
        return report_digest(evaluate(report, now=report.collected_at), speed)

    first = two_sample_report(node, clock)
    heat(node.gpus[2], 3)  # warmer, still under every threshold
    later = two_sample_report(node, clock)
    assert later.gpus["2"]["temperature_c"] != first.gpus["2"]["temperature_c"]
    assert digest(later) == digest(first)
    assert digest(later, 700.4) == digest(first)  # the same speed to 3 significant digits
    assert digest(later, 490.0) != digest(first)  # a straggler now

    heat(node.gpus[2], 96 - node.gpus[2].idle_temp_c)  # over thermal_critical, busy or idle
    assert digest(two_sample_report(node, clock)) != digest(first)


def test_a_configmap_of_another_node_or_without_a_report_is_unknown(node, clock):
    held = report_configmap(two_sample_report(node, clock), "d")
    other = read_report(held, "gpu-node-b", now=clock.now)
    assert not other.signals["gpu_count"].known
    assert "holds a report of node 'gpu-node-a'" in other.signals["gpu_count"].reason
    empty = read_report({"data": {}}, "gpu-node-a", now=clock.now)
    assert empty.signals["gpu_count"].reason == "trainops-system/node-health-gpu-node-a has no report.json"
    assert read_report(held, "gpu-node-a", now=clock.now).to_dict() == json.loads(held["data"]["report.json"])
