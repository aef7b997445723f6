"""What a campaign result measured: the commit, and the content of the code it ran, path by path.

``MEASURED`` is the code a campaign's numbers depend on: the harness, the baseline's DAG, the demo trainer,
and the product code each run goes through (the training run, claim and return, the health gate's
judgement and quarantine, checkpoint verification and the choice of the latest, the trainer's checkpoint
helper) or the report is computed with (the checkpoint-interval advice).  ``stamp()`` records
git's hash of each as the campaign ran it (uncommitted edits included, through a throw-away index), so
``tests/capacity/test_campaign_fresh.py`` can tell, on any clone, whether the result is older than the
code: a path whose hash at HEAD differs was changed after the campaign that the result comes from.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# trainops/capacity's modules the claim and the return run (not its CLI, nor the queue check
# only ClaimNodesOperator makes); a module one of these starts to use changes the importer too
CAPACITY = (
    "claims",
    "drain",
    "inference",
    "loans",
    "overflow",
    "prepull",
    "procedure",
    "quota",
    "ranking",
)
MEASURED = (
    "benchmarks/campaign",
    "benchmarks/dags/bench_training_provider.py",
    "devcluster/trainops_devcluster/demo/trainer.py",
    "trainops/training",
    *(f"trainops/capacity/{name}.py" for name in CAPACITY),
    "trainops/health/gate.py",
    "trainops/health/policy.py",
    "trainops/health/quarantine.py",
    "trainops/checkpoints/latest.py",
    "trainops/checkpoints/verify.py",
    "trainops/checkpoints/helper.py",  # the trainer's resume_from, commit and heartbeat (last_save_s)
    "trainops/checkpoints/interval.py",  # the report's checkpoint-interval advice
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
