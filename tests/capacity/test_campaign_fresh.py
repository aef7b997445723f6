"""The committed campaign result is fresh: measured on the code as it is, and what the README says.

When one of these fails, the code the campaign measures changed since ``benchmarks/campaign.json`` was
made: run ``make campaign`` (it rewrites the JSON and the README's numbers) and commit both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.campaign.faults import FAULTS
from benchmarks.campaign.readme import disagreements
from benchmarks.campaign.stamp import MEASURED, git, hashes, stale

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


def with_one_file_changed(path: str) -> str:
    """A git tree: HEAD with one file under ``path`` edited (a line appended)."""
    file = (
        path
        if (REPO / path).is_file()
        else git("ls-tree", "-r", "--name-only", "HEAD", "--", path).split()[0]
    )
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=REPO,
        input=git("show", f"HEAD:{file}") + "\n# changed\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", "HEAD", env=env)
        git("update-index", "--cacheinfo", f"100644,{blob},{file}", env=env)
        return git("write-tree", env=env)


@pytest.mark.parametrize("path", MEASURED)
def test_a_change_anywhere_in_a_measured_tree_makes_the_result_stale_naming_that_tree(path):
    recorded = hashes(with_one_file_changed(path))  # a campaign that ran on an edited copy

    assert stale(recorded) == [path]


def test_every_module_of_the_repository_the_campaign_runs_is_measured():
    # the harness with the baseline, each step's worker, the devcluster and the trainer its pods run
    entry = (
        "benchmarks.campaign.__main__",
        "benchmarks.campaign.lifecycle",
        "benchmarks.campaign.baseline",
        "benchmarks.campaign.outcomes",
        "benchmarks.campaign.steps",
        "trainops_devcluster.cluster",
        "trainops_devcluster.demo.trainer",
    )
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in entry)
    code += "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))"
    files = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    tracked = set(git("ls-files").split("\n"))
    loaded = {Path(f).resolve() for f in files}
    ours = {f.relative_to(REPO).as_posix() for f in loaded if f.is_relative_to(REPO)} & tracked

    unmeasured = sorted(f for f in ours if not any(f == p or f.startswith(p + "/") for p in MEASURED))
    assert len(ours) > 100 and unmeasured == []


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
