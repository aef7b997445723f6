"""``DevCluster``: the simulated GPU Kubernetes cluster, assembled and running.

It wires the object store, the API server, the simulated controllers (scheduler, kubelet,
Job, Deployment, disruption, node lifecycle, Kueue) and per-node GPU telemetry, seeds the
objects of ``topology``, writes a kubeconfig, and serves the devcluster-only endpoints under
``/devcluster/``: fault injection, the audit log and dcgm-exporter metrics per node.  With
``prometheus=True`` a real Prometheus scrapes those exporters (``prometheus_url``).

    with DevCluster(nodes=16) as cluster:
        kubernetes.config.load_kube_config(str(cluster.kubeconfig))
        cluster.inject("xid", "gpu-node-003", code=79)
"""

from __future__ import annotations

import base64
import copy
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import yaml

from trainops_devcluster import authn, defaults, kinds, rbac, topology
from trainops_devcluster.controllers import start_controllers
from trainops_devcluster.hardware import NodeProfile, homogeneous, parse_fleet
from trainops_devcluster.kueue import KueueConfig, KueueController, kueue_admission
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.pod_admission import pod_admission
from trainops_devcluster.probe_daemon import ProbeDaemon
from trainops_devcluster.prometheus import Prometheus, ScrapeTargets, target_groups
from trainops_devcluster.server import ApiServer
from trainops_devcluster.store import Store
from trainops_devcluster.telemetry import COUNTER_SETS, NodeTelemetry, render_dcgm

TOKEN = authn.ADMIN_TOKEN


class FaultError(ValueError):
    """A fault request that names an unknown fault, target or option."""


class DevCluster:
    """A running simulated cluster.  Use as a context manager, or ``start()``/``stop()``."""

    def __init__(
        self,
        nodes: int = 16,
        gpus_per_node: int = 8,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig: Path | None = None,
        seed: int = 0,
        inference: list[topology.InferenceWorkload] | None = None,
        process_env: dict[str, str] | None = None,
        kueue_config: KueueConfig | None = None,
        kueue: bool = True,
        probe_interval_s: float = 1.0,
        probe_gemm: bool = True,
        system_nodes: int = 2,
        virtual_nodes: int = 0,
        prometheus: bool = False,
        scrape_interval_s: float = 1.0,
        prometheus_port: int = 0,
        prometheus_log: Path | None = None,
        fresh: bool = False,
        fleet: list[NodeProfile] | str | None = None,
        exporter_node_label: str = "Hostname",
        exporter_counters: str = "trainops",
        exporter_node_name: bool = True,
        fabric: topology.Fabric | str | None = None,
        image_pull_s: float = 0.0,
    ) -> None:
        """``fleet``: each GPU node's hardware (a list of ``hardware.NodeProfile`` or a fleet spec such
        as ``hardware.DEMO_FLEET``); it replaces ``nodes`` and ``gpus_per_node`` (default: ``nodes``
        HGX H100 nodes of ``gpus_per_node`` GPUs). ``exporter_node_label``: the label naming the node in
        the simulated dcgm-exporter's series (``Hostname`` in its 4.x releases, ``hostname`` on main).
        ``exporter_counters``: ``trainops`` (deploy/dcgm-exporter-counters.csv) or ``default``
        (dcgm-exporter's own default counters). ``exporter_node_name`` False: dcgm-exporter runs without
        ``NODE_NAME``, so its node label holds its pod's name.
        ``kueue=False``: a cluster without Kueue (no ``kueue.x-k8s.io`` API, controller or webhook).
        ``fabric``: the GPU nodes' blocks and racks (``topology.Fabric``, or its text form such as
        ``"4,4/4,4"``); default: racks of 4 nodes, 2 racks per block.  ``image_pull_s``: how long a
        node's first pull of an image takes (the kubelet's; see ``runtime``)."""
        if exporter_counters not in COUNTER_SETS:
            raise ValueError(
                f"exporter_counters must be one of {', '.join(COUNTER_SETS)}, got {exporter_counters!r}"
            )
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be at least 1")
        if not 0 <= system_nodes <= 100:
            raise ValueError(f"system_nodes must be in 0..100, got {system_nodes}")
        if not 0 <= virtual_nodes <= 100:
            raise ValueError(f"virtual_nodes must be in 0..100, got {virtual_nodes}")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(
                f"host {host!r}: the devcluster binds loopback only (127.0.0.1, localhost or ::1)"
            )
        self.fleet = (
            parse_fleet(fleet) if isinstance(fleet, str) else list(fleet or homogeneous(nodes, gpus_per_node))
        )
        if not self.fleet:
            raise ValueError("fleet must name at least one node")
        self.nodes = nodes = len(self.fleet)
        self.fabric = topology.Fabric.parse(fabric) if isinstance(fabric, str) else fabric
        self.fabric = self.fabric or topology.Fabric.uniform(nodes)
        if self.fabric.nodes != nodes:
            raise ValueError(
                f"fabric {self.fabric.blocks} holds {self.fabric.nodes} node(s), the fleet {nodes}"
            )
        self.fresh = fresh
        self.image_pull_s = image_pull_s
        self.system_nodes = system_nodes
        self.virtual_nodes = virtual_nodes
        self.gpus_per_node = gpus_per_node if fleet is None else min(p.gpu_count for p in self.fleet)
        self.exporter_node_label = exporter_node_label
        self.seed = seed
        self.inference = topology.default_inference(nodes) if inference is None else inference
        self.store = Store()
        self.logs = PodLogs()
        self.telemetry = {
            topology.node_name(i): NodeTelemetry.from_profile(topology.node_name(i), profile, seed + i)
            for i, profile in enumerate(self.fleet)
        }
        for index, telemetry in enumerate(self.telemetry.values()):
            telemetry.exported = set(COUNTER_SETS[exporter_counters])
            if not exporter_node_name:
                telemetry.exporter_hostname = f"nvidia-dcgm-exporter-{index:05x}"
        self._tmp = None if kubeconfig else tempfile.TemporaryDirectory(prefix="devcluster-")
        self.kubeconfig = kubeconfig or Path(self._tmp.name) / "kubeconfig"
        self._kueue_config = (kueue_config or KueueConfig()) if kueue else None
        self.server = ApiServer(
            self.store,
            logs=self.logs,
            host=host,
            port=port,
            admission=[kueue_admission, pod_admission(self.store)] if kueue else [pod_admission(self.store)],
            extension=self._extension,
            kueue_version=self._kueue_config.version if kueue else None,
        )
        self._process_env = dict(process_env or {})
        self._controllers = None
        self._kueue = None
        self.probe_daemon = ProbeDaemon(
            self.store, self.telemetry, interval_s=probe_interval_s, gemm=probe_gemm
        )
        self._prometheus_dir = (
            tempfile.TemporaryDirectory(prefix="devcluster-prometheus-") if prometheus else None
        )
        self.prometheus = (
            Prometheus(
                Path(self._prometheus_dir.name),
                scrape_interval_s=scrape_interval_s,
                port=prometheus_port,
                log_file=prometheus_log,
            )
            if self._prometheus_dir
            else None
        )
        self.prometheus_url = ""
        self._scrape_targets: ScrapeTargets | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> DevCluster:
        self._seed_objects()
        for name in self.telemetry:  # the probe's first round at boot, GPUs idle: the GEMM is timed then
            self.probe_daemon.probe(name)
        self._controllers = start_controllers(
            self.store,
            self.logs,
            self.telemetry,
            self._process_env,
            self.server.validating,
            self.image_pull_s,
        )
        if self._kueue_config is not None:
            self._kueue = KueueController(self.store, self._kueue_config)
            self._kueue.start()

        self.probe_daemon.start()
        self.url = self.server.start()
        self.write_kubeconfig(self.kubeconfig)
        if self.prometheus is not None:
            try:
                self._start_prometheus()
            except BaseException:
                self.stop()
                raise
        return self

    def _start_prometheus(self) -> None:
        hostport = self.url.removeprefix("http://")
        # the first targets file, written before Prometheus reads it, whatever the fleet's size
        nodes = [obj["metadata"]["name"] for obj in self.store.list("nodes")[0]]
        self.prometheus.set_targets(target_groups(hostport, [n for n in nodes if n in self.telemetry]))
        self._scrape_targets = ScrapeTargets(self.store, self.prometheus, hostport, self.telemetry)
        self._scrape_targets.start()
        self.prometheus_url = self.prometheus.start()

    def wait_until_scraped(self, timeout: float = 120.0) -> None:
        """Block until Prometheus has scraped every exporting node once since now (or TimeoutError)."""
        import requests

        exporting = sum(1 for t in self.telemetry.values() if not t.missing)
        since = time.time()
        up = 'up{job="dcgm-exporter"}'
        query = f"count((timestamp({up}) > {since:.3f}) and ({up} == 1))"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                body = requests.get(
                    f"{self.prometheus_url}/api/v1/query", params={"query": query}, timeout=30
                ).json()
            except requests.Timeout:  # a busy machine and a large fleet: ask again until the deadline
                continue
            result = body["data"]["result"]
            if result and int(float(result[0]["value"][1])) >= exporting:
                return
            time.sleep(0.2)
        raise TimeoutError(f"Prometheus did not scrape all {exporting} exporters within {timeout:g}s")

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        if self._scrape_targets:
            self._scrape_targets.stop()
        if self._prometheus_dir:
            self._prometheus_dir.cleanup()
        self.server.stop()
        self.probe_daemon.stop()
        if self._kueue:
            self._kueue.stop()
        if self._controllers:
            self._controllers.stop()
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def faults(self):
        return self._controllers.faults

    def _create(self, resource: str, obj: dict) -> None:
        defaults.apply(kinds.by_resource(resource), obj, creating=True)
        self.store.create(resource, obj)

    def _seed_objects(self) -> None:
        create = self._create
        for resource, obj in rbac.BOOTSTRAP:
            create(resource, copy.deepcopy(obj))
        for name in topology.namespaces(fresh=self.fresh, inference=bool(self.inference)):
            create("namespaces", topology.namespace(name))
        for index, (profile, labels) in enumerate(zip(self.fleet, self.fabric.labels(), strict=True)):
            node = topology.gpu_node(index, profile)
            create(
                "nodes",
                node | {"metadata": {**node["metadata"], "labels": node["metadata"]["labels"] | labels}},
            )
        for index in range(self.system_nodes):
            create("nodes", topology.system_node(index))
        for index in range(self.virtual_nodes):
            create("nodes", topology.virtual_node(index, self.gpus_per_node))
        for workload in self.inference:
            create("deployments.apps", topology.inference_deployment(workload, self.gpus_per_node))
            create("poddisruptionbudgets.policy", topology.pod_disruption_budget(workload))
            create("services", topology.inference_service(workload))
        for resource, obj in topology.gpu_operator_objects():
            create(resource, obj)
        queues = self._kueue_config is not None and not self.fresh
        for resource, obj in topology.kueue_objects(self._kueue_config.version) if queues else ():
            create(resource, obj)

    def create_from_file(self, manifest: Path) -> None:
        """Create every object of a YAML manifest (``deploy/rbac.yaml``) through the API, in the
        file's order, as the admin's ``kubectl create -f`` would: what names no namespace goes to
        ``default``, what is there already is left as it is, and anything the API refuses (a
        namespace that does not exist yet, a kind it does not serve) stops it, naming the object."""
        import requests

        try:
            docs = [d for d in yaml.safe_load_all(Path(manifest).read_text()) if d]
        except yaml.YAMLError as error:
            raise ValueError(f"{manifest}: not YAML: {error}") from None
        for doc in docs:
            if not isinstance(doc, dict):
                raise ValueError(f"{manifest}: a document is not a Kubernetes object: {str(doc)[:100]!r}")
            group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
            kind = next(
                (
                    k
                    for k in self.server.served.kinds
                    if (k.group, k.version, k.kind) == (group, version, doc.get("kind"))
                ),
                None,
            )
            meta = doc.get("metadata") or {}
            what = f"{manifest}: {doc.get('kind')} {meta.get('name', '')!r} ({doc.get('apiVersion')})"
            if kind is None:
                served = sorted({f"{k.kind} ({k.api_version})" for k in self.server.served.kinds})
                raise ValueError(
                    f"{what}: the devcluster does not serve this kind; it serves {', '.join(served)}"
                )
            prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
            if kind.namespaced:  # kubectl puts an object that names no namespace in its context's
                prefix += f"/namespaces/{meta.get('namespace') or 'default'}"
            answer = requests.post(
                f"{self.url}{prefix}/{kind.plural}",
                json=doc,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=60,
            )
            if answer.status_code not in (201, 409) or (
                answer.status_code == 409 and answer.json().get("reason") != "AlreadyExists"
            ):
                raise ValueError(f"{what}: {answer.json().get('message', answer.text)}")

    def _ensure_namespace(self, name: str) -> None:
        if self.store.find("namespaces", "", name) is None:
            self._create("namespaces", topology.namespace(name))

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path, *, expiration_s: int = 24 * 3600
    ) -> Path:
        """Write a kubeconfig at ``path`` whose user is ServiceAccount ``namespace/name`` (created
        if absent) with a token from its TokenRequest subresource: what a pod running as that
        account has.  RBAC then decides what it may do.  It names the HTTPS port, as kubectl sends
        credentials only over TLS."""
        self._ensure_namespace(namespace)
        if self.store.find("serviceaccounts", namespace, name) is None:
            self._create("serviceaccounts", {"metadata": {"name": name, "namespace": namespace}})
        answer = self.server.tokens.request(namespace, name, {"spec": {"expirationSeconds": expiration_s}})
        return self.write_kubeconfig(
            path,
            token=answer["status"]["token"],
            user=f"{namespace}/{name}",
            namespace=namespace,
            secure=True,
        )

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str = TOKEN,
        user: str = "devcluster-admin",
        namespace: str = "default",
        secure: bool = False,
    ) -> Path:
        """A kubeconfig that stock kubectl and both Python clients use unchanged (the admin's unless
        ``token`` is another user's; ``secure``: the HTTPS URL and its certificate)."""
        cluster: dict = {"server": self.url}
        if secure:
            ca = base64.b64encode(self.server.serving_cert.cert_pem).decode()
            cluster = {"server": self.server.secure_url, "certificate-authority-data": ca}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "devcluster", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "devcluster",
                    "context": {"cluster": "devcluster", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "devcluster",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def service_address(self, namespace: str, name: str, port: int) -> str:
        """``host:port`` on this machine where ``port`` of Service ``namespace/name`` is served,
        balanced over its Ready endpoints (``proxy``), as its cluster IP is on a cluster."""
        service = self.store.get("services", namespace, name)
        return f"127.0.0.1:{self._controllers.runtime.loopback.port(service, port)}"

    def wait_until_settled(self, timeout: float = 30.0) -> None:
        """Block until every inference Deployment has all its replicas ready (or raise TimeoutError)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            deployments, _ = self.store.list("deployments.apps")
            if all(
                d.get("status", {}).get("readyReplicas", 0) == d["spec"].get("replicas", 0)
                for d in deployments
            ):
                return
            time.sleep(0.05)
        raise TimeoutError("inference Deployments did not become ready")

    # ---- fault injection ---------------------------------------------------------------
    def fault_table(self) -> dict[str, Callable[..., object]]:
        """Fault name (as on the command line) -> function(target, **options)."""
        faults = self.faults
        server = self.server

        def split(target: str) -> tuple[str, str]:
            namespace, sep, name = target.partition("/")
            if not sep or not name:
                raise FaultError(f"target {target!r} must be NAMESPACE/NAME")
            return namespace, name

        return {
            "crash-pod": lambda target, exit_code=1, reason="Error", message="": faults.crash_pod(
                *split(target), exit_code=int(exit_code), reason=reason, message=str(message)[:4096]
            ),
            "crash-job": lambda target: faults.crash_job(*split(target)),
            "hang": lambda target: faults.hang_job(*split(target)),
            "xid": lambda target, code, gpu=0: faults.xid(target, int(code), gpu=int(gpu)),
            "ecc": lambda target, uncorrectable, gpu=0: faults.ecc(target, int(uncorrectable), gpu=int(gpu)),
            "ib-down": lambda target, port=1, device=None: faults.ib_down(
                target, port=int(port), device=device
            ),
            "nvlink-down": lambda target, gpu=0, link=0: faults.hardware(
                target, "nvlink_down", gpu=int(gpu), link=int(link)
            ),
            "pcie-degraded": lambda target, width, gpu=0: faults.hardware(
                target, "pcie_degraded", int(width), gpu=int(gpu)
            ),
            "overheat": lambda target, degrees, gpu=0: faults.hardware(
                target, "overheat", float(degrees), gpu=int(gpu)
            ),
            "remap-failure": lambda target, gpu=0: faults.hardware(target, "remap_failure", gpu=int(gpu)),
            "retire-pages": lambda target, count, gpu=0: faults.hardware(
                target, "retire_pages", int(count), gpu=int(gpu)
            ),
            "mig-device-lost": lambda target, gpu=0: faults.hardware(target, "mig_device_lost", gpu=int(gpu)),
            "ib-rate": lambda target, rate, port=1, device=None: faults.hardware(
                target, "ib_rate", str(rate), port=int(port), device=device
            ),
            "ib-errors": lambda target, counter, count, port=1, device=None: faults.hardware(
                target, "ib_errors", str(counter), int(count), port=int(port), device=device
            ),
            "nvml-init-error": lambda target, error="NVML_ERROR_LIBRARY_NOT_FOUND": faults.nvml_init_error(
                target, str(error)
            ),
            "nvlink-errors": lambda target, replay, gpu=0: faults.nvlink_errors(
                target, int(replay), gpu=int(gpu)
            ),
            "slow-gpu": lambda target, factor, gpu=None: faults.slow_gpu(
                target, float(factor), gpu=None if gpu is None else int(gpu)
            ),
            "telemetry-missing": lambda target: faults.telemetry_missing(target),
            "repair": lambda target: faults.repair(target),
            "node-notready": lambda target: faults.node_not_ready(target),
            "api-fault": lambda target="", *, path, status, count=None, fraction=None: server.faults.add(
                path,
                int(status),
                count=None if count is None else int(count),
                fraction=None if fraction is None else float(fraction),
            ),
            "drop-watches": lambda target="": server.drop_watches(),
        }

    def inject(self, fault: str, target: str = "", **options) -> dict:
        """Inject one fault, e.g. ``inject("xid", "gpu-node-003", code=79)``; returns what was done."""
        table = self.fault_table()
        if fault not in table:
            raise FaultError(f"unknown fault {fault!r}; known faults: {', '.join(sorted(table))}")
        options = {key.replace("-", "_"): value for key, value in options.items() if value is not None}
        try:
            result = table[fault](target, **options)
        except TypeError as error:
            raise FaultError(f"fault {fault!r}: bad options {sorted(options)}: {error}") from None
        return {"fault": fault, "target": target, "options": options, "result": result}

    # ---- /devcluster/ endpoints --------------------------------------------------------
    def _extension(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, str, bytes]:
        parts = [unquote(p) for p in path.strip("/").split("/")][1:]
        try:
            if method == "POST" and parts[:1] == ["faults"] and len(parts) == 2:
                options = json.loads(body or b"{}")
                target = options.pop("target", "")
                return _json(200, self.inject(parts[1], target, **options))
            if method == "GET" and parts == ["audit"]:
                return _json(200, {"entries": self.server.audit.entries()})
            if method == "GET" and len(parts) == 3 and parts[0] == "nodes" and parts[2] == "metrics":
                if parts[1] not in self.telemetry:
                    return _json(404, {"error": f"no node {parts[1]!r}"})
                return (
                    200,
                    "text/plain; version=0.0.4",
                    render_dcgm(self.telemetry[parts[1]], self.exporter_node_label).encode(),
                )
        except (FaultError, ValueError, KeyError) as error:
            return _json(400, {"error": str(error)})
        return _json(404, {"error": f"no devcluster endpoint {method} {path}"})


def _json(status: int, payload: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(payload, default=str).encode()
