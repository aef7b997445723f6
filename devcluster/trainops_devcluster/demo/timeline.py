"""What the demo shows a person: timestamped lines of what happened, and the end-state checks."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


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
