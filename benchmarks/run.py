"""Runs every ``benchmarks/bench_*.py`` in turn; exits non-zero when any benchmark misses its target.

Each benchmark prints one line per measurement:
``bench <name>: <figures> ratio=<r> target=<t> PASS|FAIL`` (the ratio is against a baseline
measured in the same run, so the numbers mean something on a shared, noisy machine).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    failed = []
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)]).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"benchmarks that missed a target or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
