"""Stock kubectl against a devcluster, as a user runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run ``kubectl --kubeconfig KUBECONFIG ARGS``; with ``check``, a failure fails the test with kubectl's stderr."""
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result
