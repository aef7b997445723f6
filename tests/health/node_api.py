"""A minimal Kubernetes API server for Node objects, for testing the probe's publishing over HTTP.

It serves GET and merge-PATCH of ``/api/v1/nodes/NAME`` and its ``/status`` subresource, enforces
``metadata.resourceVersion`` preconditions with 409 Conflict, and can simulate a concurrent writer
(the kubelet) that updates the node just before the next N patches arrive.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class NodeApi:
    def __init__(self, nodes: list[str]):
        self.lock = threading.Lock()
        self.rv = 1
        self.nodes = {name: self._node(name) for name in nodes}
        self.concurrent_writes = 0
        self.conflicts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.handle(self, None)

            def do_PATCH(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.handle(self, (self.headers["Content-Type"], json.loads(body)))

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _node(self, name: str) -> dict[str, Any]:
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "resourceVersion": str(self.rv),
                "annotations": {"other.io/keep": "yes"},
            },
            "status": {"conditions": [ready]},
        }

    def _bump(self, node: dict[str, Any]) -> None:
        self.rv += 1
        node["metadata"]["resourceVersion"] = str(self.rv)

    def handle(self, request: BaseHTTPRequestHandler, patch: tuple[str, Any] | None) -> None:
        parts = request.path.split("?")[0].strip("/").split("/")
        with self.lock:
            node = (
                self.nodes.get(parts[3]) if len(parts) >= 4 and parts[:3] == ["api", "v1", "nodes"] else None
            )
            if node is None:
                return self._reply(request, 404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            if patch is not None:
                content_type, body = patch
                if content_type != "application/merge-patch+json":
                    return self._reply(request, 415, {"kind": "Status", "code": 415})
                if self.concurrent_writes:
                    self.concurrent_writes -= 1
                    node["status"]["conditions"][0]["message"] = f"heartbeat {self.rv}"
                    self._bump(node)
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                    self.conflicts += 1
                    status = {
                        "kind": "Status",
                        "code": 409,
                        "reason": "Conflict",
                        "message": "object was modified",
                    }
                    return self._reply(request, 409, status)
                body.get("metadata", {}).pop("resourceVersion", None)
                keep = "metadata" if parts[4:] == ["status"] else "status"  # each endpoint changes its half
                updated = merge_patch(node, body)
                updated[keep] = node[keep]
                self._bump(updated)
                node.clear()
                node.update(updated)
            return self._reply(request, 200, node)

    def _reply(self, request: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        request.send_response(code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
