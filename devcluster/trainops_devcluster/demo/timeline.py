"""What the demo shows a person: timestamped lines of what happened, inference as it served (Ready
replicas by pool, requests served and failed), and the end-state checks."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from trainops.capacity.overflow import OVERFLOW_OF_LABEL
from trainops_devcluster.demo.load import Result, Stats, stats

# Ready replicas of each inference workload: name -> (primary Ready, primary wanted, overflow Ready, overflow wanted)
Serving = dict[str, tuple[int, int, int, int]]


class Timeline:
    """Prints ``[  12.3s] what happened`` lines to ``out`` (the terminal, not the log file)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.start = out, time.monotonic()

    def say(self, text: str) -> None:
        stamp = f"[{time.monotonic() - self.start:6.1f}s] "
        lines = text.splitlines() or [""]
        print(stamp + lines[0], file=self.out, flush=True)
        for line in lines[1:]:
            print(" " * len(stamp) + line, file=self.out, flush=True)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}", file=self.out, flush=True)
        return ok

    def serving(self, now: Serving, requests: list[Result] | None) -> None:
        """One line: Ready replicas by pool, and what came of the requests since the last line."""
        pools = "; ".join(
            f"{name} {ready + extra} Ready ({ready}/{want} primary"
            + (f" + {extra}/{wanted} overflow" if wanted or extra else "")
            + ")"
            for name, (ready, want, extra, wanted) in sorted(now.items())
        )
        line = f"inference: {pools}"
        if requests:
            got = stats("", requests, 0)
            line += f" | {got.served} served, {got.failed} failed since the last line, p99 {got.p99_ms or 0:.0f} ms"
        self.say(line)

    def phases(self, rows: list[Stats]) -> None:
        self.say(
            "requests to the inference Service, by phase of the run:\n" + "\n".join(r.line() for r in rows)
        )


def serving(deployments: list[dict]) -> Serving:
    """Ready and wanted replicas of each workload, its overflow companion's counted apart."""
    out: dict[str, list[int]] = {}
    for d in deployments:
        primary = (d["metadata"].get("labels") or {}).get(OVERFLOW_OF_LABEL)
        counts = out.setdefault(primary or d["metadata"]["name"], [0, 0, 0, 0])
        at = 2 if primary else 0
        counts[at] += (d.get("status") or {}).get("readyReplicas", 0)
        counts[at + 1] += d["spec"].get("replicas", 1)
    return {name: (a, b, c, e) for name, (a, b, c, e) in out.items()}


@contextlib.contextmanager
def terminal_only_for_timeline(log_path: Path) -> Iterator[TextIO]:
    """Send everything written to stdout/stderr (Airflow, the S3 server, warnings) to ``log_path``;
    yield a stream to the real terminal for the timeline."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved_out), "w", buffering=1)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield terminal
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            terminal.close()
