"""Runs every ``benchmarks/bench_*.py`` in turn, prints a summary table and writes ``benchmarks/bench.json``;
exits non-zero when any benchmark misses its target, fails, or is cut off.

Each benchmark prints one line per measurement:
``bench <name>: <figures> ratio=<r> target<=<t> PASS|FAIL`` (the ratio is against a baseline
measured in the same run, so the numbers mean something on a shared, noisy machine), and records the
same as data (``results.record``), which this script collects through the file named by
``BENCH_RESULTS``. The JSON holds the commit (``git rev-parse HEAD``), whether tracked files had
uncommitted changes, and per benchmark its exit status, wall time and result lines (measured values,
ratio, target, pass/fail as the benchmark judged them). ``python -m benchmarks.results`` writes the
README's benchmark rows from it.

Sizes: by default the sizes the README quotes, meant to finish within ``BENCH_BUDGET_S`` (1,800 s) on a
2-core machine; ``BENCH_LARGE=1`` (``make bench BENCH_LARGE=1``) adds the large ones (the health gate at
8,192 nodes, whose devcluster alone has taken over 50 minutes to set up there) and lifts the budget.
Once the budget is spent the running benchmark is interrupted (SIGINT to its process group, so its
servers are torn down; SIGKILL 60 s later) and the rest are not started; the summary says which
(``BENCH_BUDGET_S=0``: no budget).

``run.py [NAME ...] [--json PATH]``: only the benchmarks whose file name contains a NAME (the JSON then
says ``partial``), written to PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results import RESULTS_ENV, read_records, stamp, summary  # noqa: E402

DEFAULT_BUDGET_S = 1800.0
INTERRUPT_GRACE_S = 60.0


def large() -> bool:
    return os.environ.get("BENCH_LARGE", "") not in ("", "0")


def budget_s() -> float | None:
    """Seconds for the whole run: ``BENCH_BUDGET_S``, else 1,800 by default and none with BENCH_LARGE."""
    given = os.environ.get("BENCH_BUDGET_S")
    value = float(given) if given else (0.0 if large() else DEFAULT_BUDGET_S)
    return value or None


def run_one(script: Path, timeout: float | None) -> dict:
    """One benchmark script in its own process group; its exit status, wall time and records."""
    with tempfile.TemporaryDirectory(prefix="bench-results-") as scratch:
        records = Path(scratch) / "records.jsonl"
        env = {**os.environ, RESULTS_ENV: str(records)}
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, str(script)], env=env, start_new_session=True, preexec_fn=default_sigint
        )
        timed_out = False
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            print(f"== {script.name}: the run's budget is spent, interrupting it", flush=True)
            code = interrupt(process)
        except KeyboardInterrupt:  # its own session does not get the terminal's Ctrl-C: pass it on
            interrupt(process)
            raise
        return {
            "script": script.name,
            "exit": code,
            "timed_out": timed_out,
            "wall_s": round(time.monotonic() - started, 1),
            "results": read_records(records),
        }


def default_sigint() -> None:
    """In the benchmark's process: SIGINT interrupts it even when this runner was started in the background
    (a non-interactive shell starts background jobs with SIGINT ignored, and a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(process: subprocess.Popen) -> int:
    """SIGINT to the benchmark's process group (it tears its servers down), SIGKILL if it outlasts the grace."""
    signal_group(process, signal.SIGINT)
    try:
        return process.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        signal_group(process, signal.SIGKILL)
        return process.wait()


def signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # it and its children already ended
        pass


def passed(entry: dict) -> bool:
    return (
        entry["exit"] == 0
        and not entry["timed_out"]
        and all(r["passed"] is not False for r in entry["results"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only the benchmarks whose file name contains one of these")
    parser.add_argument("--json", type=Path, default=HERE / "bench.json", help="where to write the results")
    args = parser.parse_args(argv)
    scripts = sorted(HERE.glob("bench_*.py"))
    chosen = [s for s in scripts if not args.names or any(n in s.name for n in args.names)]
    budget = budget_s()
    stamped, started = stamp(), time.monotonic()
    entries, not_run = [], []
    for script in chosen:
        left = None if budget is None else budget - (time.monotonic() - started)
        if left is not None and left <= 0:
            not_run.append(script.name)
            continue
        print(f"== {script.name}", flush=True)
        entries.append(run_one(script, left))
    result = {
        "stamp": stamped,
        "large": large(),
        "budget_s": budget,
        "partial": len(chosen) < len(scripts),
        "only": args.names,
        "wall_s": round(time.monotonic() - started, 1),
        "benchmarks": entries,
        "not_run": not_run,
        "passed": not not_run and all(passed(e) for e in entries),
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n== summary (also in {args.json})")
    print(summary(result))
    failed = [e["script"] for e in entries if not passed(e)]
    if failed:
        print(f"benchmarks that missed a target, failed or were cut off: {', '.join(failed)}")
    if not_run:
        print(f"not run, the {budget:g} s budget spent: {', '.join(not_run)}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
