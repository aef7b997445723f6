"""The demo scenario: watch a ``training_lifecycle`` run on the devcluster, crash a node mid-run, check the end.

``Watcher`` is an observer: a thread that looks at the cluster, the bucket and Airflow's task
states a few times a second and tells the timeline what changed, inference included (Ready
replicas by pool, and the requests a steady load sends through the Service meanwhile, labelled by
phase of the run). It also injects the fault: an XID on one training node once a checkpoint past
``crash_after_step`` is verified.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from trainops.capacity.overflow import OVERFLOW_OF_LABEL
from trainops.capacity.procedure import ReturnSummary
from trainops.conventions import (
    CLAIMED_BY_ANNOTATION,
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    MODE_TAINT,
    MODE_TRAINING,
    QUARANTINE_EVIDENCE_ANNOTATION,
    QUARANTINE_TAINT,
)
from trainops.placement.request import BLOCK_LABEL, RACK_LABEL
from trainops_devcluster.demo.load import Load, stats
from trainops_devcluster.demo.timeline import Serving, Timeline, serving
from trainops_devcluster.topology import InferenceWorkload

ATTEMPT_LABEL = "trainops.io/attempt"
TRAINING = "training"
# The demo's inference: llm-chat is real demo inference servers behind its Service, with the virtual
# node as its overflow pool (its trainops.io/overflow-pool annotation); together they fill the GPU pool
# but for an idle node or two, so the claim displaces replicas.
INFERENCE = [
    InferenceWorkload("llm-chat", 11, min_available=8, server=True, overflow=True),
    InferenceWorkload("embeddings", 1, min_available=0),
]
SERVICE = ("inference", "llm-chat", 80)
LOAD_RPS = 20.0  # a third of what 11 replicas answer (5 requests/s each)
SERVING_EVERY_S = 15.0  # a serving line at least this often, changed or not
# The run's phases for the load's report: the task whose start begins each
PHASES = {"claim_nodes": "claim", "fabric_ready": "training", "return_capacity": "return"}


def _json(response) -> dict:
    return json.loads(response.data)


@dataclass
class Cluster:
    """Reads of the devcluster through the official client."""

    api: Any

    def list(self, what: str, namespace: str | None = None) -> list[dict]:
        from kubernetes import client

        core, apps, batch = (
            client.CoreV1Api(self.api),
            client.AppsV1Api(self.api),
            client.BatchV1Api(self.api),
        )
        calls = {
            "nodes": lambda: core.list_node(_preload_content=False),
            "pods": lambda: core.list_namespaced_pod(namespace, _preload_content=False),
            "jobs": lambda: batch.list_namespaced_job(namespace, _preload_content=False),
            "deployments": lambda: apps.list_deployment_for_all_namespaces(_preload_content=False),
        }
        return _json(calls[what]())["items"]

    def workloads(self) -> list[dict]:
        from kubernetes import client

        return client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", TRAINING, "workloads"
        )["items"]

    def gpu_quota(self) -> str:
        from kubernetes import client

        queue = client.CustomObjectsApi(self.api).get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", TRAINING
        )
        return next(
            str(r["nominalQuota"])
            for group in queue["spec"]["resourceGroups"]
            for flavor in group["flavors"]
            for r in flavor["resources"]
            if r["name"] == "nvidia.com/gpu"
        )


def attempt_of(job_name: str) -> str:
    return job_name.rpartition("-a")[2]


@dataclass
class Watcher:
    """Polls and narrates; injects the XID once a checkpoint past ``crash_after_step`` is verified."""

    timeline: Timeline
    cluster: Cluster
    devcluster: Any  # DevCluster, for inject()
    dag_id: str
    run_uri: str
    crash_after_step: int
    load: Load | None = None
    interval_s: float = 0.3
    crashed_node: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _seen: set = field(default_factory=set)
    _task_states: dict = field(default_factory=dict)
    _serving: Serving = field(default_factory=dict)
    _said_at: float = 0.0
    attempt_nodes: dict = field(default_factory=dict)  # attempt -> the nodes its pods ran on

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._loop, name="demo-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the last word: whatever changed since

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as error:  # an observer must not stop the run; say it and go on
                self.timeline.say(f"(watcher: {type(error).__name__}: {error})")

    def once(self, key: Any, text: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self.timeline.say(text)

    def poll(self) -> None:
        self._tasks()
        self._jobs()
        self._workloads()
        self._pods()
        self._checkpoints()
        self._nodes()
        self._inference()

    # ---- Airflow -----------------------------------------------------------------------
    def _tasks(self) -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(
                    TaskInstance.task_id, TaskInstance.run_id, TaskInstance.state, TaskInstance.try_number
                ).where(TaskInstance.dag_id == self.dag_id)
            ).all()
        for task_id, run_id, state, try_number in rows:
            if state is None or self._task_states.get(task_id) == (state, try_number):
                continue
            self._task_states[task_id] = (state, try_number)
            if (
                self.load
                and state == "running"
                and task_id in PHASES
                and ("phase", task_id) not in self._seen
            ):
                self._seen.add(("phase", task_id))
                self.load.phase(PHASES[task_id])
            if self.load and task_id == "return_capacity" and state == "success":
                self.load.phase("after")
            if state in ("success", "failed", "up_for_retry", "upstream_failed"):
                self.timeline.say(
                    f"task {task_id}: {state}" + (f" (try {try_number})" if try_number > 1 else "")
                )
                if state == "success":
                    self._task_result(task_id, SimpleNamespace(dag_id=self.dag_id, run_id=run_id))

    def _task_result(self, task_id: str, run: Any) -> None:
        from trainops_devcluster.airflow_home import xcom_value

        value = xcom_value(run, task_id) or {}
        if task_id == "reserve_run_path":
            self.timeline.say(f"run path {value['run_uri']} reserved for this DAG run")
        elif task_id == "health_gate":
            counts = Counter(v["verdict"] for v in value["verdicts"])
            lines = [
                f"  {v['name']}: {v['verdict']}: {v['reasons'][0]}"
                for v in value["verdicts"]
                if v["verdict"] not in ("ok", "warn")
            ]
            self.timeline.say(
                f"health gate: {len(value['verdicts'])} nodes checked ({dict(counts)}); "
                f"{len(value['node_names'])} healthy chosen; quarantined: {', '.join(value['quarantined']) or 'none'}"
                + ("\n" + "\n".join(lines) if lines else "")
            )
        elif task_id == "claim_nodes":
            offloaded = ", ".join(f"{w} {n} replica(s)" for w, n in value["offloaded"].items())
            not_offloaded = "".join(
                f"; not offloaded: {w}: {why}" for w, why in value["not_offloaded"].items()
            )
            self.timeline.say(
                f"claimed {', '.join(value['node_names'])} ({value['gpus']} GPUs) for training; "
                f"moved to the overflow pool first: {offloaded or 'nothing'}{not_offloaded}; inference shrunk: "
                f"{', '.join(value['workloads_shrunk']) or 'none'}; pods evicted: {value['evictions']}"
            )
            placement = value.get("placement") or {}
            if placement.get("reason"):
                self.timeline.say(f"placement: {placement['reason']}")
            pulled = sorted(n for n, state in (value.get("prepulled") or {}).items() if state == "pulled")
            if pulled:
                self.timeline.say(
                    f"training image pulled onto {', '.join(pulled)} (hot spares: a resume pays no pull)"
                )
        elif task_id == "train":
            self.timeline.say(
                f"training done: {value['attempts']} attempt(s), {value['resumes_used']} resume(s), "
                f"final checkpoint step {value['checkpoint']['step']}"
            )
        elif task_id == "verify_checkpoint":
            self.timeline.say(
                f"final checkpoint verified: {value['uri']} (step {value['step']}, {value['format']})"
            )
        elif task_id == "return_capacity":
            self.timeline.say(ReturnSummary(**value).describe())

    # ---- the cluster -------------------------------------------------------------------
    def _workloads(self) -> None:
        for w in self.cluster.workloads():
            job = (w["metadata"].get("ownerReferences") or [{}])[0].get("name", "?")
            for c in (w.get("status") or {}).get("conditions") or []:
                if c["type"] in ("Admitted", "Evicted", "Preempted") and c["status"] == "True":
                    key = (w["metadata"]["name"], c["type"], c.get("lastTransitionTime"))
                    self.once(
                        key, f"Kueue: attempt {attempt_of(job)} {c['type'].lower()}: {c.get('message', '')}"
                    )

    def _pods(self) -> None:
        by_attempt: dict[str, list[dict]] = {}
        for pod in self.cluster.list("pods", TRAINING):
            by_attempt.setdefault(pod["metadata"]["labels"].get(ATTEMPT_LABEL, "?"), []).append(pod)
            status = pod.get("status") or {}
            if status.get("phase") == "Failed":
                terminated = next(
                    (
                        s["state"]["terminated"]
                        for s in status.get("containerStatuses") or []
                        if "terminated" in s["state"]
                    ),
                    {},
                )
                why = (
                    terminated.get("message") or terminated.get("reason") or status.get("reason") or "failed"
                )
                self.once(
                    ("failed", pod["metadata"]["name"]),
                    f"CRASH: pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')} failed: {why}",
                )
        for attempt, pods in by_attempt.items():
            running = sorted(
                p["spec"]["nodeName"] for p in pods if (p.get("status") or {}).get("phase") == "Running"
            )
            if running and len(running) == len(pods) and attempt not in self.attempt_nodes:
                self.attempt_nodes[attempt] = running
                where = ", ".join(f"{n} ({self._domain(n)})" for n in running)
                self.timeline.say(f"attempt {attempt}: {len(running)} pods running on {where}")

    def _domain(self, node: str) -> str:
        """``block-b/rack-2``: where the node sits in the fabric."""
        labels = labels_of(self.cluster.list("nodes"), node)
        return "/".join(labels.get(level, "?") for level in (BLOCK_LABEL, RACK_LABEL))

    def _jobs(self) -> None:
        for job in self.cluster.list("jobs", TRAINING):
            name, attempt = job["metadata"]["name"], job["metadata"]["labels"].get(ATTEMPT_LABEL, "?")
            env = {
                e["name"]: e.get("value")
                for e in job["spec"]["template"]["spec"]["containers"][0].get("env", [])
            }
            resume = env.get("TRAINOPS_RESUME_FROM") or ""
            kept_out = job["metadata"].get("annotations", {}).get("trainops.io/kept-out") or "{}"
            excluded = ", ".join(sorted(json.loads(kept_out)))
            self.once(
                ("job", name),
                f"attempt {attempt}: Job {name} submitted to Kueue; "
                + (f"RESUMES from {resume}" if resume else "fresh start at step 0")
                + (f"; keeps out {excluded}" if excluded else ""),
            )
            for c in (job.get("status") or {}).get("conditions") or []:
                if c["type"] in ("Complete", "Failed") and c["status"] == "True":
                    self.once(("job-end", name), f"attempt {attempt}: Job {c['type'].lower()}")

    def _checkpoints(self) -> None:
        from trainops.checkpoints.store import CheckpointStore
        from trainops.checkpoints.uri import S3Uri
        from trainops.checkpoints.verify import verify_checkpoint

        run = S3Uri.parse(self.run_uri, field="run_uri")
        store = CheckpointStore()
        for info in store.list(run):
            if not info.key.endswith("/_COMMITTED"):
                continue
            uri = f"s3://{run.bucket}/{info.key.rpartition('/')[0]}/"
            if ("checkpoint", uri) in self._seen:
                continue
            result = verify_checkpoint(uri, store=store)
            if result.ok:
                self.once(
                    ("checkpoint", uri),
                    f"checkpoint step {result.step} committed and verified ({result.level})",
                )
                if result.step >= self.crash_after_step and self.crashed_node is None:
                    self._inject_xid()

    def _inject_xid(self) -> None:
        pods = [
            p
            for p in self.cluster.list("pods", TRAINING)
            if (p.get("status") or {}).get("phase") == "Running"
            and p["metadata"]["labels"].get(ATTEMPT_LABEL) == "1"
        ]
        if not pods:
            return
        node = sorted(p["spec"]["nodeName"] for p in pods)[-1]
        self.crashed_node = node
        self.timeline.say(f">>> injecting XID 79 (GPU fallen off the bus) on training node {node}")
        self.devcluster.inject("xid", node, code=79)

    def _nodes(self) -> None:
        for node in self.cluster.list("nodes"):
            name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
            if labels.get(HEALTH_LABEL) == HEALTH_QUARANTINED:
                taint = next(
                    (t for t in node["spec"].get("taints") or [] if t["key"] == QUARANTINE_TAINT), {}
                )
                self.once(("quarantined", name), f"node {name} QUARANTINED ({taint.get('value', '?')})")

    def _inference(self) -> None:
        now = serving(self.cluster.list("deployments"))
        if now == self._serving and time.monotonic() - self._said_at < SERVING_EVERY_S:
            return
        requests = self.load.since(self._said_at) if self.load and self._said_at else None
        self._serving, self._said_at = now, time.monotonic()
        self.timeline.serving(now, requests)


def labels_of(nodes: list[dict], name: str) -> dict:
    return next((n["metadata"].get("labels") or {} for n in nodes if n["metadata"]["name"] == name), {})


def end_state_checks(
    timeline: Timeline,
    cluster: Cluster,
    dag_run: Any,
    seeded_replicas: dict[str, int],
    run_uri: str,
    crashed: str | None,
    worker_calls: list[dict],
    load: Load,
    attempt_nodes: dict[str, list[str]] | None = None,
) -> bool:
    """Check the cluster and the bucket after the run; True only when every check passes.
    ``worker_calls``: the audit log's entries of the workers' ServiceAccount, which the DAG ran as;
    ``load``: the requests sent to the inference Service through the run."""
    from trainops.checkpoints.latest import latest_verified
    from trainops_devcluster.airflow_home import xcom_value

    nodes = cluster.list("nodes")
    claimed = [
        n["metadata"]["name"]
        for n in nodes
        if CLAIMED_BY_ANNOTATION in (n["metadata"].get("annotations") or {})
    ]
    training = [
        n["metadata"]["name"]
        for n in nodes
        if any(
            t["key"] == MODE_TAINT and t.get("value") == MODE_TRAINING for t in n["spec"].get("taints") or []
        )
    ]
    deployments = {d["metadata"]["name"]: d for d in cluster.list("deployments")}
    overflow = [n for n, d in deployments.items() if OVERFLOW_OF_LABEL in (d["metadata"].get("labels") or {})]
    requests = stats("all", load.since(load.phases[0][0]), 0)
    phases = {row.phase: row for row in load.report()}
    replicas = {
        name: (d["spec"]["replicas"], (d.get("status") or {}).get("readyReplicas", 0))
        for name, d in deployments.items()
    }
    latest = latest_verified(run_uri).checkpoint
    verified = xcom_value(dag_run, "verify_checkpoint")
    faulty = next((n for n in nodes if n["metadata"]["name"] == crashed), None)
    faulty_labels = (faulty or {}).get("metadata", {}).get("labels") or {}
    faulty_annotations = (faulty or {}).get("metadata", {}).get("annotations") or {}
    checks = [
        ("the DAG run succeeded", dag_run.state == "success", f"state {dag_run.state}"),
        (
            "no node claimed",
            not claimed and not training,
            f"claimed: {claimed or 'none'}; training mode: {training or 'none'}",
        ),
        (
            "inference back at full replicas, all Ready",
            all(replicas[n] == (seeded_replicas[n], seeded_replicas[n]) for n in seeded_replicas),
            ", ".join(
                f"{n} {ready}/{want} ready (seeded {seeded_replicas[n]})"
                for n, (want, ready) in replicas.items()
            ),
        ),
        (
            "inference served through the whole run (the overflow pool took the displaced replicas)",
            requests.served > 0 and requests.failed == 0,
            f"{requests.served} requests served, {requests.failed} failed; p99 "
            + ", ".join(f"{name} {row.p99_ms or 0:.0f} ms" for name, row in phases.items()),
        ),
        (
            "the overflow pool given back",
            not overflow,
            f"companion Deployments left: {', '.join(overflow) or 'none'}",
        ),
        (
            "training quota back to zero",
            cluster.gpu_quota() in ("0", "0.0"),
            f"nominalQuota {cluster.gpu_quota()}",
        ),
        (
            "final checkpoint verified",
            latest is not None and verified is not None and verified["uri"] == latest.uri,
            f"{latest.uri if latest else 'none'} (step {latest.step if latest else '-'})",
        ),
        (
            "the faulty node quarantined with evidence",
            crashed is not None
            and faulty_labels.get(HEALTH_LABEL) == HEALTH_QUARANTINED
            and QUARANTINE_EVIDENCE_ANNOTATION in faulty_annotations,
            f"{crashed or 'no fault was injected'}: {faulty_labels.get(HEALTH_LABEL, 'not quarantined')}",
        ),
    ]
    blocks = {
        attempt: sorted({(labels_of(nodes, n).get(BLOCK_LABEL) or "?") for n in running})
        for attempt, running in (attempt_nodes or {}).items()
    }
    first, resumed = (attempt_nodes or {}).get("1", []), (attempt_nodes or {}).get("2", [])
    spare = sorted(set(resumed) - set(first))
    checks.append(
        (
            "the run in one block, resumed on a spare of that block",
            len(blocks.get("1", [])) == 1 and blocks.get("2") == blocks.get("1") and len(spare) == 1,
            f"attempt 1 on {', '.join(first) or '-'} ({', '.join(blocks.get('1', [])) or '-'}); attempt 2 on "
            f"{', '.join(resumed) or '-'} ({', '.join(blocks.get('2', [])) or '-'}), spare {', '.join(spare) or '-'}",
        )
    )
    denied = sorted(
        {f"{e['status']} {e['method']} {e['path']}" for e in worker_calls if e["status"] in (401, 403)}
    )
    checks.append(
        (
            "trainops ran as its ServiceAccount, no call denied (deploy/rbac.yaml)",
            bool(worker_calls) and not denied,
            f"{len(worker_calls)} API calls as {worker_calls[0]['user'] if worker_calls else 'nobody'}; "
            f"denied: {', '.join(denied) or 'none'}",
        )
    )
    return all([timeline.check(name, ok, detail) for name, ok, detail in checks])
