"""Shared health-test helpers: a healthy simulated node and reports built from it."""

from __future__ import annotations

import pytest
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, TelemetryIbReader

from trainops.health.nvml_reader import NvmlReader
from trainops.health.probe import collect_report
from trainops.health.report import HealthReport

NOW = 1_700_000_000.0


class Clock:
    """A settable clock for telemetry and readers."""

    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def node(clock: Clock) -> NodeTelemetry:
    return NodeTelemetry.healthy("gpu-node-a", gpus=8, seed=7, clock=clock)


def two_sample_report(telemetry: NodeTelemetry, clock: Clock, between=lambda: None) -> HealthReport:
    """A probe report with rates: sample, run ``between`` (inject faults), advance 60 s, sample again."""
    with NvmlReader(FakeNvml(telemetry), clock=clock) as reader:
        ib = TelemetryIbReader(telemetry)
        first = collect_report(
            reader, ib, telemetry.node_name, now=clock.now, speed_probe=telemetry.measure_speed
        )
        between()
        clock.now += 60
        return collect_report(
            reader,
            ib,
            telemetry.node_name,
            now=clock.now,
            previous=first,
            speed_probe=telemetry.measure_speed,
        )
