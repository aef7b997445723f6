"""What a campaign result measured: the commit, and the content of the code it ran, tree by tree.

``MEASURED`` is everything a campaign's numbers depend on, as whole trees: the harness and the baseline's
DAG, the product (its core and the manifests it ships), the simulated cluster the runs meet (its
controllers, its fault model, the demo trainer its pods run), the test helpers the harness imports, and
the dependency pins of the three distributions (Airflow and its providers, the baseline's operator).
``tests/capacity/test_campaign_fresh.py`` shows every module the harness imports lies in one of them.
``stamp()`` records git's hash of each as the campaign ran it (uncommitted edits included, through a
throw-away index), so that test can tell, on any clone, whether the result is older than the code: a
path whose hash at HEAD differs was changed after the campaign that the result comes from.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEASURED = (
    "benchmarks/campaign",  # the harness
    "benchmarks/dags",  # the baseline's DAG
    "trainops",  # the product's core: every procedure a run goes through, the kube layer and its retries
    "deploy",  # the manifests the product ships (the Kueue queues the devcluster applies)
    "devcluster/trainops_devcluster",  # the simulated cluster, its faults, the demo trainer
    "tests/capacity/helpers.py",  # the seeded objects and the rival writer (and its packages' inits)
    "tests/capacity/__init__.py",
    "tests/__init__.py",
    "pyproject.toml",  # dependency pins: Airflow and the providers
    "core/pyproject.toml",
    "devcluster/pyproject.toml",
)


def git(*args: str, env: dict | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def hashes(tree: str = "HEAD") -> dict[str, str]:
    """git's object id of each measured path in ``tree``."""
    return {path: git("rev-parse", f"{tree}:{path}") for path in MEASURED}


def working_tree() -> str:
    """The id of a tree holding HEAD with the working copy's measured paths as they are now."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", "HEAD", env=env)
        git("add", "--all", "--", *MEASURED, env=env)
        return git("write-tree", env=env)


def stamp(options: dict) -> dict:
    """The commit the campaign ran on, whether its measured paths had uncommitted edits, their hashes as
    run, and the options."""
    measured = hashes(working_tree())
    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted": measured != hashes(),
        "measured": measured,
        "options": options,
    }


def stale(recorded: dict) -> list[str]:
    """The measured paths whose content at HEAD differs from what the recorded campaign ran."""
    now = hashes()
    return [path for path in MEASURED if recorded.get(path) != now[path]]
