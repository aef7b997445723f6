"""The committed campaign result is fresh: measured on the code as it is, and what the README says.

When one of these fails, the code the campaign measures changed since ``benchmarks/campaign.json`` was
made: run ``make campaign`` (it rewrites the JSON and the README's numbers) and commit both.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.campaign.faults import FAULTS
from benchmarks.campaign.readme import disagreements
from benchmarks.campaign.stamp import MEASURED, hashes, stale

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "campaign.json"
README = REPO / "README.md"


def result() -> dict:
    return json.loads(RESULT.read_text())


def test_the_campaign_json_was_measured_on_the_code_as_it_is_now():
    changed = stale(result()["stamp"]["measured"])

    assert changed == [], f"changed since benchmarks/campaign.json was made: {changed}; run `make campaign`"


def test_the_readme_says_what_the_campaign_json_does_and_counts_the_codes_fault_kinds():
    assert disagreements(README.read_text(), result(), FAULTS) == []


def test_a_measured_path_changed_since_the_campaign_is_named():
    recorded = hashes()
    recorded["trainops/training"] = "0" * 40  # the campaign ran an older training run

    assert stale(recorded) == ["trainops/training"]
    assert set(MEASURED) >= {"trainops/training", "benchmarks/campaign", "trainops/capacity/procedure.py"}


def test_a_readme_whose_fault_count_or_numbers_differ_is_named():
    readme, ran = README.read_text(), result()
    kinds = len(FAULTS)
    miscounted = readme.replace(f"{kinds} fault kinds", f"{kinds + 3} fault kinds")
    old_numbers = readme.replace(
        f"**{ran['violations']} violations**", f"**{ran['violations'] + 1} violations**"
    )

    assert any("the README counts" in d for d in disagreements(miscounted, ran, FAULTS))
    assert any("not what the JSON says" in d for d in disagreements(old_numbers, ran, FAULTS))
    assert any("the code has" in d for d in disagreements(readme, ran, FAULTS[:-1]))
