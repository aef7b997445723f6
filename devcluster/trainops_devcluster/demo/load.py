"""A steady request rate to an inference Service, and what came of every request.

    load = Load("127.0.0.1:41234", rate=24).start()
    load.phase("claim")          # label what follows
    ...
    load.stop()
    for row in load.report(): print(row.line())

Open loop: request ``i`` is due at ``start + i / rate`` whatever happened to the others (a slow
service never slows the load down), and its latency counts from when it was due, so requests held
up on this side count too.  Each request is ``GET /v1/infer`` on a connection of its own (the
Service balances connections, as kube-proxy does).  Failed: anything but a 200 within
``timeout_s`` (a 503, a refused or reset connection, a timeout).  The requests are sent from a
child process (``python -m trainops_devcluster.demo.load ADDRESS --rate R``, one JSON line per
answer), so the devcluster's threads, which serve the Service, do not delay them; both sides read
the same monotonic clock.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

MAX_LINE = 1024  # a child's result line is far shorter; longer ones are not ours


@dataclass(frozen=True)
class Result:
    due: float  # monotonic time the request was due
    latency_s: float
    ok: bool
    answer: str  # the HTTP status, or the error


@dataclass
class Stats:
    phase: str
    seconds: float
    served: int = 0
    failed: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        p50 = "-" if self.p50_ms is None else f"{self.p50_ms:.0f} ms"
        p99 = "-" if self.p99_ms is None else f"{self.p99_ms:.0f} ms"
        errors = f" ({', '.join(f'{k}: {v}' for k, v in sorted(self.errors.items()))})" if self.errors else ""
        return (
            f"{self.phase:<10} {self.seconds:6.1f}s  served {self.served:5d}  failed {self.failed:4d}{errors}"
            f"  p50 {p50:>7}  p99 {p99:>7}"
        )


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile (None when there are no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def stats(phase: str, results: list[Result], seconds: float) -> Stats:
    served = [r.latency_s * 1000 for r in results if r.ok]
    out = Stats(phase, seconds, len(served), len(results) - len(served))
    for r in results:
        if not r.ok:
            out.errors[r.answer] = out.errors.get(r.answer, 0) + 1
    out.p50_ms, out.p99_ms = percentile(served, 0.5), percentile(served, 0.99)
    return out


class Sender:
    """The child's side: sends the requests and prints each result as a JSON line."""

    def __init__(self, address: str, rate: float, timeout_s: float, path: str = "/v1/infer") -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port, self.rate, self.timeout_s, self.path = host, int(port), rate, timeout_s, path
        self.stopped = threading.Event()
        self._out = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(16, int(rate * timeout_s)), thread_name_prefix="load")

    def run(self) -> None:
        start, index = time.monotonic(), 0
        while not self.stopped.wait(max(0.0, start + index / self.rate - time.monotonic())):
            self._pool.submit(self._request, start + index / self.rate)
            index += 1
        self._pool.shutdown(wait=True)

    def _request(self, due: float) -> None:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            connection.request("GET", self.path)
            response = connection.getresponse()
            response.read()
            ok, answer = response.status == 200, str(response.status)
        except (OSError, http.client.HTTPException) as error:
            ok, answer = False, type(error).__name__
        finally:
            connection.close()
        with self._out:
            print(json.dumps([due, time.monotonic() - due, ok, answer]), flush=True)


class Load:
    """The parent's side: starts the child, labels phases, collects the results as they come."""

    def __init__(self, address: str, rate: float, *, timeout_s: float = 10.0) -> None:
        if not rate > 0 or not timeout_s > 0:
            raise ValueError(f"rate and timeout_s must be > 0, got {rate!r} and {timeout_s!r}")
        self.address, self.rate, self.timeout_s = address, rate, timeout_s
        self.results: list[Result] = []
        self.phases: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def start(self, phase: str = "before") -> Load:
        self.phase(phase)
        argv = [
            sys.executable,
            "-m",
            __name__,
            self.address,
            f"--rate={self.rate}",
            f"--timeout={self.timeout_s}",
        ]
        # its stdin is a pipe from this process: it stops when this process ends, however it ends
        self._child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, name="load-results", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._child.stdout:
            try:
                due, latency, ok, answer = json.loads(line[:MAX_LINE])
                result = Result(float(due), float(latency), bool(ok), str(answer)[:100])
            except (ValueError, TypeError):
                continue
            with self._lock:
                self.results.append(result)

    def phase(self, name: str) -> None:
        """Requests due from now on belong to phase ``name``."""
        with self._lock:
            self.phases.append((time.monotonic(), name))

    def stop(self) -> None:
        """Stop sending; wait for the answers of the requests in flight."""
        self.phase("end")
        self._child.terminate()
        try:
            self._child.wait(self.timeout_s + 10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._reader.join()

    def since(self, t0: float, t1: float | None = None) -> list[Result]:
        """The requests due in ``[t0, t1)``."""
        with self._lock:
            return [r for r in self.results if r.due >= t0 and (t1 is None or r.due < t1)]

    def report(self) -> list[Stats]:
        """One row per phase, in order (a phase named twice is one row)."""
        with self._lock:
            marks = list(self.phases)
        if marks[-1][1] != "end":
            marks.append((time.monotonic(), "end"))
        rows: dict[str, tuple[list[Result], float]] = {}
        for (t0, name), (t1, _) in zip(marks, marks[1:], strict=False):
            results, seconds = rows.get(name, ([], 0.0))
            rows[name] = (results + self.since(t0, t1), seconds + t1 - t0)
        return [stats(name, results, seconds) for name, (results, seconds) in rows.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__name__}", description="send the load (see the module)"
    )
    parser.add_argument("address", help="host:port of the Service")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a request may take")
    args = parser.parse_args(argv)
    sender = Sender(args.address, args.rate, args.timeout)
    signal.signal(signal.SIGTERM, lambda *_: sender.stopped.set())
    threading.Thread(target=lambda: (sys.stdin.read(), sender.stopped.set()), daemon=True).start()
    sender.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
