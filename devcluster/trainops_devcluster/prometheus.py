"""A real Prometheus (Debian's ``prometheus`` package) scraping every GPU node's dcgm-exporter.

Targets come from file-based service discovery: :class:`ScrapeTargets` watches the nodes and
rewrites ``targets/nodes.json`` (atomically) when nodes come and go, so Prometheus starts and
stops scraping them as on a real cluster.  Each target is the node's exporter endpoint on the
devcluster's API server (``__metrics_path__``), labelled ``instance=<node>:9400`` and
``node=<node>``.  Prometheus logs (to ``log_file``, by default in its work directory) and records
every query in its work directory, never on the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Container
from pathlib import Path

import requests
import yaml

from trainops_devcluster.informer import InformerController
from trainops_devcluster.local_s3 import free_port
from trainops_devcluster.store import Store

JOB = "dcgm-exporter"
EXPORTER_PORT = 9400  # dcgm-exporter's port, shown in ``instance``
REAL_SCRAPE_INTERVAL_S = 15.0  # dcgm-exporter's ServiceMonitor interval on a real cluster


class PrometheusUnavailable(RuntimeError):
    """The prometheus binary is missing or did not become ready."""


class Prometheus:
    """One Prometheus process; ``start()`` returns its URL."""

    def __init__(
        self,
        workdir: Path,
        *,
        scrape_interval_s: float = 1.0,
        port: int = 0,
        binary: str | None = None,
        log_file: Path | None = None,
    ) -> None:
        if not 0.1 <= scrape_interval_s <= 300:
            raise ValueError(f"scrape_interval_s must be in [0.1, 300], got {scrape_interval_s}")
        self.workdir = workdir
        self.scrape_interval_s = scrape_interval_s
        self.port = port  # 0: a free one
        self.binary = binary or shutil.which("prometheus") or "/usr/bin/prometheus"
        self.targets_file = workdir / "targets" / "nodes.json"
        self.log_file = log_file or workdir / "prometheus.log"  # outlives the work directory if given
        self.query_log = workdir / "queries.log"
        self.url = ""
        self._process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> str:
        if not os.access(self.binary, os.X_OK):
            raise PrometheusUnavailable(
                f"no prometheus binary at {self.binary}: install Debian's prometheus "
                "(scripts/install-system-packages) or start the devcluster without Prometheus"
            )
        if not self.targets_file.exists():
            self.set_targets([])
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
                "query_log_file": str(self.query_log),
            },
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "30s"}],
                }
            ],
        }
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        port = self.port or free_port()
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PrometheusUnavailable(
                    f"prometheus exited with {self._process.returncode}; see {self.log_file}"
                )
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self.url
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusUnavailable(f"prometheus was not ready within {timeout:g}s; see {self.log_file}")

    def set_targets(self, groups: list[dict]) -> None:
        """Replace the file_sd target groups (write a temporary file, then rename it over)."""
        self.targets_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.targets_file.with_suffix(".json.tmp")
        partial.write_text(json.dumps(groups))
        partial.replace(self.targets_file)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


def target_groups(api_hostport: str, nodes: list[str]) -> list[dict]:
    """One file_sd target group per node's exporter."""
    return [
        {
            "targets": [api_hostport],
            "labels": {
                "__metrics_path__": f"/devcluster/nodes/{node}/metrics",
                "instance": f"{node}:{EXPORTER_PORT}",
                "node": node,
            },
        }
        for node in sorted(nodes)
    ]


class ScrapeTargets(InformerController):
    """Keep Prometheus' targets equal to the nodes that exist and run an exporter."""

    watches = ("nodes",)

    def __init__(
        self, store: Store, prometheus: Prometheus, api_hostport: str, exporters: Container[str]
    ) -> None:
        super().__init__(store)
        self.prometheus, self.api_hostport, self.exporters = prometheus, api_hostport, exporters
        self._written: list[str] | None = None

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if old is None or new is None:  # a node came or went
            self.mark("nodes")

    def reconcile(self, keys: set) -> None:
        nodes = sorted(name for _, name in self.cache["nodes"] if name in self.exporters)
        if nodes != self._written:
            self.prometheus.set_targets(target_groups(self.api_hostport, nodes))
            self._written = nodes
