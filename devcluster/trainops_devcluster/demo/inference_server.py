"""A small inference server for the devcluster's process runtime: its latency depends on its load.

    python -m trainops_devcluster.demo.inference_server --service-ms 200 --slots 1 --max-queue 8

``GET /v1/infer`` takes one of ``--slots`` (a GPU's concurrent batch) for ``--service-ms``; requests
beyond the free slots wait in a queue, so the answer's latency grows with the load, and once
``--max-queue`` wait the server answers 503 at once (overloaded), as model servers do.
``GET /metrics`` counts answers by code (Prometheus text).  It listens on ``--port`` (default
``$DEVCLUSTER_PORT_8080``, the local port the devcluster gives the pod's containerPort 8080, else 8080).

It behaves as vLLM does by default, so a hand-off that is not safe fails requests here as on a cluster:

* **Loading**: it listens at once but loads its model for ``--load-seconds`` (1); meanwhile
  ``GET /health`` (vLLM's; ``/healthz`` too) answers 503 and ``/v1/infer`` 503.  A pod without a
  readinessProbe on ``/health`` is Ready, and sent requests, before its model has loaded.
* **SIGTERM**: with ``--shutdown-timeout`` 0 (vLLM's default) it aborts the requests in flight and
  exits at once; with ``--shutdown-timeout S`` it takes no new request and exits once those in
  flight are done, after S seconds at most (vllm-project/vllm#36666).  ``--drain-seconds N`` (0)
  keeps it serving N seconds after SIGTERM first, as a ``preStop`` sleep of N would.
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
        self.in_flight = 0
        self.loaded = threading.Event()
        self.stopping = threading.Event()
        self.answered: dict[int, int] = {}

    def infer(self) -> tuple[int, dict]:
        started = time.monotonic()
        if not self.loaded.is_set():
            return self._count(503), {"error": "the model is still loading"}
        if self.stopping.is_set():
            return self._count(503), {"error": "shutting down"}
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
            if self.path in ("/health", "/healthz"):
                if model.loaded.is_set():
                    self._answer(200, {"status": "ok"})
                else:
                    self._answer(503, {"status": "loading"})
            elif self.path.startswith("/v1/infer"):
                with model._lock:
                    model.in_flight += 1
                try:
                    code, body = model.infer()
                finally:
                    with model._lock:
                        model.in_flight -= 1
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
    parser.add_argument(
        "--load-seconds", type=float, default=1.0, help="model loading: /health 503 till done"
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=0.0,
        help="after SIGTERM, finish in-flight requests (0: abort)",
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=0.0, help="serving on after SIGTERM (a preStop)"
    )
    args = parser.parse_args(argv)
    numbers = (args.service_ms, args.max_queue, args.drain_seconds, args.load_seconds, args.shutdown_timeout)
    if min(numbers) < 0 or args.slots < 1:
        parser.error(
            "--service-ms, --max-queue, --drain-seconds, --load-seconds and --shutdown-timeout must be >= 0, "
            "--slots >= 1"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = Model(args.service_ms / 1000, args.slots, args.max_queue)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(model, os.environ.get("HOSTNAME", "")))
    server.daemon_threads = False  # server_close() waits for the requests in flight

    def stop() -> None:
        if not args.shutdown_timeout:  # vLLM's default: the requests in flight are aborted
            print(
                f"SIGTERM: aborting {model.in_flight} request(s) in flight; answered {model.answered}",
                flush=True,
            )
            os._exit(0)
        model.stopping.set()
        threading.Timer(args.shutdown_timeout, lambda: os._exit(0)).start()
        server.shutdown()

    def terminate(signum, frame) -> None:
        threading.Timer(args.drain_seconds, stop).start()

    signal.signal(signal.SIGTERM, terminate)
    threading.Timer(args.load_seconds, model.loaded.set).start()
    print(f"serving on 127.0.0.1:{args.port}; loading the model for {args.load_seconds:g}s", flush=True)
    server.serve_forever()
    server.server_close()  # waits for the requests in flight
    print(f"drained; answered {model.answered}", flush=True)
    os._exit(0)  # the shutdown-timeout timer is no reason to stay


if __name__ == "__main__":
    sys.exit(main())
