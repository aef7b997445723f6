"""A small inference server for the devcluster's process runtime: its latency depends on its load.

    python -m trainops_devcluster.demo.inference_server --service-ms 200 --slots 1 --max-queue 8

``GET /v1/infer`` takes one of ``--slots`` (a GPU's concurrent batch) for ``--service-ms``; requests
beyond the free slots wait in a queue, so the answer's latency grows with the load, and once
``--max-queue`` wait the server answers 503 at once (overloaded), as model servers do.
``GET /healthz`` is the readiness probe's; ``GET /metrics`` counts answers by code (Prometheus text).
It listens on ``--port`` (default ``$DEVCLUSTER_PORT_8080``, the local port the devcluster gives the
pod's containerPort 8080, else 8080).  On SIGTERM it keeps serving for ``--drain-seconds`` (the
time the endpoint takes to leave every proxy, as a ``preStop`` sleep gives it), then finishes the
requests in flight and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Model:
    """``slots`` concurrent requests of ``service_s`` each, at most ``max_queue`` waiting."""

    def __init__(self, service_s: float, slots: int, max_queue: int) -> None:
        self.service_s, self.max_queue = service_s, max_queue
        self._slots = threading.Semaphore(slots)
        self._lock = threading.Lock()
        self.waiting = 0
        self.answered: dict[int, int] = {}

    def infer(self) -> tuple[int, dict]:
        started = time.monotonic()
        with self._lock:
            if self.waiting >= self.max_queue:
                return self._count(503), {"error": f"overloaded: {self.waiting} requests waiting"}
            self.waiting += 1
        with self._slots:
            with self._lock:
                self.waiting -= 1
            queued = time.monotonic() - started
            time.sleep(self.service_s)
        with self._lock:
            self._count(200)
        return 200, {"queued_ms": round(queued * 1000, 1)}

    def _count(self, code: int) -> int:
        self.answered[code] = self.answered.get(code, 0) + 1
        return code


def handler(model: Model, pod: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/healthz":
                self._answer(200, {"status": "ok"})
            elif self.path.startswith("/v1/infer"):
                code, body = model.infer()
                self._answer(code, {"pod": pod, **body})
            elif self.path == "/metrics":
                lines = [
                    f'inference_requests_total{{code="{code}"}} {count}'
                    for code, count in sorted(model.answered.items())
                ]
                self._answer(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4")
            else:
                self._answer(404, {"error": f"no {self.path}"})

        def _answer(self, code: int, body, content_type: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
            pass  # one line per request would flood the pod log

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainops_devcluster.demo.inference_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEVCLUSTER_PORT_8080", "8080")))
    parser.add_argument("--service-ms", type=float, default=200.0, help="time one request holds a slot")
    parser.add_argument("--slots", type=int, default=1, help="requests served at once")
    parser.add_argument("--max-queue", type=int, default=8, help="waiting requests before 503s")
    parser.add_argument("--drain-seconds", type=float, default=2.0, help="serving on after SIGTERM")
    args = parser.parse_args(argv)
    if args.service_ms < 0 or args.slots < 1 or args.max_queue < 0 or args.drain_seconds < 0:
        parser.error("--service-ms, --max-queue and --drain-seconds must be >= 0, --slots >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = Model(args.service_ms / 1000, args.slots, args.max_queue)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(model, os.environ.get("HOSTNAME", "")))
    server.daemon_threads = False  # server_close() waits for the requests in flight

    def drain(signum, frame) -> None:
        threading.Timer(args.drain_seconds, server.shutdown).start()

    signal.signal(signal.SIGTERM, drain)
    print(f"serving on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    server.server_close()
    print(f"drained; answered {model.answered}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
