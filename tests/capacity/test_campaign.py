"""Issue 15: a short seeded subset of the fault campaign (``make campaign`` runs 200)."""

from __future__ import annotations

from benchmarks.campaign import FAULTS, campaign


def test_a_seeded_campaign_of_every_fault_kind_has_no_violation():
    report = campaign(runs=8, seed=16, nodes=12)

    assert report.runs == 8
    assert set(report.faults) == set(FAULTS), report.faults  # seed 16 draws every kind in 8 runs
    assert report.violations == []
