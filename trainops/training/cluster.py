"""The training run's calls to the cluster, on ``Kube``'s sync clients: submit, find, inspect and stop
Jobs.  Transient API errors are retried until a deadline (``trainops.kube.retry``).  Async code (the
follower in the triggerer) runs them in a thread; only the watches are async (``trainops.kube.aio``)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainops.errors import TemporaryError
from trainops.kube.client import MERGE_PATCH, Kube
from trainops.kube.kueue import BY_USER, resource, served_version, workload_facts
from trainops.kube.nodes import json_of, read_node
from trainops.kube.retry import Backoff, Deadline, call, is_transient, wait_before_retry
from trainops.training.job import JOB_NAME_LABEL, RUN_LABEL, finished
from trainops.training.naming import run_key

log = logging.getLogger(__name__)
API_DEADLINE_S = 120.0
LOG_TAIL_LINES = 100
MAX_CONCURRENT_READS = 8
WORKLOADS = "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MISSING, EXISTS, GONE = 404, 409, 410
WATCH_READ_SLACK_S = 10.0


class GangCluster:
    """The run's Jobs, pods, Workloads and nodes through ``kube``."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.core, self.batch, self.custom = kube.core, kube.batch, kube.custom

    def _call(self, fn, what: str, *, unless: int | None = None, deadline_s: float = API_DEADLINE_S):
        """``fn()`` under the retry policy for ``deadline_s``; None when the API answers ``unless`` (an
        outcome here, not an error: the object is missing or exists)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return call(fn, Deadline(deadline_s), what)
        except ApiException as error:
            if error.status != unless:
                raise
            return None

    def read_job(self, namespace: str, name: str) -> dict | None:
        response = self._call(
            lambda: self.batch.read_namespaced_job(name, namespace, _preload_content=False),
            f"read Job {namespace}/{name}",
            unless=MISSING,
        )
        return None if response is None else json_of(response)

    def create_job(self, job: dict) -> tuple[dict, bool]:
        """Create the Job; returns it and whether this call created it (False: it already existed)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        created = self._call(
            lambda: self.batch.create_namespaced_job(namespace, job, _preload_content=False),
            f"create Job {namespace}/{name}",
            unless=EXISTS,
        )
        if created is not None:
            return json_of(created), True
        existing = self.read_job(namespace, name)
        if existing is None:
            raise TemporaryError(f"Job {namespace}/{name} reported as existing but cannot be read")
        return existing, False

    def create_service(self, service: dict) -> bool:
        """Create a Service; False when it already existed."""
        namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
        created = self._call(
            lambda: self.core.create_namespaced_service(namespace, service, _preload_content=False),
            f"create Service {namespace}/{name}",
            unless=EXISTS,
        )
        return created is not None

    def kueue_version(self) -> str:
        """The Kueue API version the cluster serves (discovered once per client)."""
        return served_version(self.kube.api_client)

    def deactivate_workload(self, namespace: str, name: str) -> bool:
        """Stop a run through its Kueue Workload (``spec.active=false``: Kueue evicts it and does not
        requeue it); False when that Workload no longer exists."""
        patched = self._call(
            lambda: self.custom.patch_namespaced_custom_object(
                *resource(self.custom, WORKLOADS)[:2],
                namespace,
                WORKLOADS,
                name,
                {"spec": {"active": False}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"deactivate Workload {namespace}/{name}",
            unless=MISSING,
        )
        return patched is not None

    def workloads(self, namespace: str, job: dict) -> list[dict]:
        """The Kueue Workloads of ``job`` (by its uid)."""
        listed = self._call(
            lambda: self.custom.list_namespaced_custom_object(
                *resource(self.custom, WORKLOADS)[:2],
                namespace,
                WORKLOADS,
                label_selector=f"{JOB_UID_LABEL}={job['metadata']['uid']}",
                _preload_content=False,
            ),
            f"list the Workloads of Job {job['metadata']['name']}",
        )
        return json_of(listed).get("items") or []

    def stopped(self, namespace: str, job: dict) -> str | None:
        """The name of ``job``'s Workload when someone stopped the run (``stop``), else None; one Kueue
        deactivated itself is not a stop (the follow reports it with Kueue's reason)."""
        return next(
            (
                w["metadata"]["name"]
                for w in self.workloads(namespace, job)
                if workload_facts(w).deactivated_by == BY_USER
            ),
            None,
        )

    def stop(self, namespace: str, job_name: str) -> str:
        """Stop the run: deactivate its Workload (``spec.active=false``: Kueue evicts it and does not
        requeue it), or, when Kueue made no Workload for it, delete the Job with Foreground
        propagation.  Returns what was done."""
        job = self.read_job(namespace, job_name)
        if job is None:
            return f"Job {namespace}/{job_name} is already gone"
        names = [w["metadata"]["name"] for w in self.workloads(namespace, job)]
        if names:
            for name in names:
                self.deactivate_workload(namespace, name)
            return f"deactivated Workload {', '.join(names)} (spec.active=false)"
        self._call(
            lambda: self.batch.delete_namespaced_job(
                job_name, namespace, propagation_policy="Foreground", _preload_content=False
            ),
            f"delete Job {namespace}/{job_name}",
            unless=MISSING,
        )
        return f"deleted Job {namespace}/{job_name} (Foreground propagation)"

    def stop_run(self, namespace: str, run: str, deadline: Deadline) -> list[str]:
        """Stop every unfinished Job of ``run`` (``<dag_id>/<run_id>``; ``stop``: idempotent) and wait, until
        ``deadline``, until none of its pods is pending or running; returns what was done.  Giving
        the run's nodes back calls it first: the trigger that stops a run whose task was failed by
        hand may come later than the teardown, or never (a triggerer that was down does not run
        ``on_kill``), and a reaped or hand-returned run may still be training."""
        dag_id, _, run_id = run.partition("/")
        selector = f"{RUN_LABEL}={run_key(dag_id, run_id)}"
        done = [
            self.stop(namespace, job["metadata"]["name"])
            for job in self.run_jobs(namespace, run)
            if not finished(job)
        ]
        while live := self._live_pods(namespace, selector):
            deadline.sleep(0.5, f"the pods of run {run} to stop ({', '.join(live)})")
        return done

    def run_jobs(self, namespace: str, run: str, deadline_s: float = API_DEADLINE_S) -> list[dict]:
        """The Jobs of ``run``'s attempts (``<dag_id>/<run_id>``, by the run label), one list."""
        dag_id, _, run_id = run.partition("/")
        listed = self._call(
            lambda: self.batch.list_namespaced_job(
                namespace, label_selector=f"{RUN_LABEL}={run_key(dag_id, run_id)}", _preload_content=False
            ),
            f"list the Jobs of run {run} in namespace {namespace}",
            deadline_s=deadline_s,
        )
        return json_of(listed).get("items") or []

    def _live_pods(self, namespace: str, selector: str) -> list[str]:
        response = self._call(
            lambda: self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False),
            f"list the pods of {selector}",
        )
        return sorted(
            pod["metadata"]["name"]
            for pod in json_of(response)["items"]
            if (pod.get("status") or {}).get("phase") in ("Pending", "Running", None)
        )

    def job_pods(self, namespace: str, name: str) -> list[dict]:
        response = self._call(
            lambda: self.core.list_namespaced_pod(
                namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _preload_content=False
            ),
            f"list the pods of Job {name}",
        )
        return json_of(response)["items"]

    def failure_evidence(
        self, namespace: str, pods: list[Mapping]
    ) -> tuple[dict[str, dict | None], dict[str, str]]:
        """What a failure is judged on, read concurrently: the nodes the pods ran on (None for a node
        that no longer exists) and the last lines of each failed pod's log (pods already gone are
        skipped)."""
        names = sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
        failed = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
        results = _concurrently(
            [lambda n=n: self._node(n) for n in names]
            + [lambda p=p: self._log_tail(namespace, p) for p in failed]
        )
        tails = {
            pod: tail for pod, tail in zip(failed, results[len(names) :], strict=True) if tail is not None
        }
        return dict(zip(names, results[: len(names)], strict=True)), tails

    def read_nodes(self, names: list[str]) -> dict[str, dict | None]:
        """Each node by name, read concurrently (None for one that no longer exists)."""
        return dict(zip(names, _concurrently([lambda n=n: self._node(n) for n in names]), strict=True))

    def node_changes(self, names: list[str], until: float) -> Iterator[dict[str, dict | None]]:
        """The nodes ``names`` now, then again each time one of them changes, until ``until``
        (``time.monotonic()``): one watch on nodes, filtered here (a field selector takes one name),
        from a version taken before the reads, so no change is missed; a broken watch (410 Gone, a
        dropped connection, a transient answer) starts over the same way.  Events stay JSON (most are of
        other nodes: a large fleet's status writes are not built into client models)."""
        from kubernetes import watch

        backoff = Backoff(base=0.2, cap=5.0)
        while time.monotonic() < until:
            version = self._call(lambda: self.core.list_node(limit=1).metadata.resource_version, "list nodes")
            nodes = self.read_nodes(names)
            yield dict(nodes)
            stream, left = watch.Watch(), until - time.monotonic()
            try:
                for event in stream.stream(
                    self.core.list_node,
                    resource_version=version,
                    timeout_seconds=max(1, math.ceil(left)),
                    _request_timeout=max(1.0, left) + WATCH_READ_SLACK_S,  # a dead connection ends too
                    deserialize=False,
                ):
                    node = event["object"]
                    if node["metadata"]["name"] in nodes and event["type"] in (
                        "ADDED",
                        "MODIFIED",
                        "DELETED",
                    ):
                        nodes[node["metadata"]["name"]] = None if event["type"] == "DELETED" else node
                        yield dict(nodes)
                    if time.monotonic() >= until:
                        return
            except Exception as error:
                if getattr(error, "status", None) != GONE and not is_transient(error):
                    raise
                log.info("the watch on nodes broke (%s); reading them again", error)
                time.sleep(min(wait_before_retry(error, backoff), max(0.0, until - time.monotonic())))
            finally:
                stream.stop()

    def _node(self, name: str) -> dict | None:
        return self._call(lambda: read_node(self.core, name), f"read node {name}", unless=MISSING)

    def _log_tail(self, namespace: str, pod: str) -> str | None:
        """The pod's last lines; None when the API refuses them (the pod is gone, say)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(
                lambda: self.core.read_namespaced_pod_log(pod, namespace, tail_lines=LOG_TAIL_LINES),
                f"read the log of pod {namespace}/{pod}",
            )
        except ApiException as error:
            log.info("no log for pod %s (%s)", pod, error.status)
            return None


def _concurrently(reads: list[Callable[[], Any]]) -> list[Any]:
    """Each read's result, in order, at most ``MAX_CONCURRENT_READS`` at a time."""
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_CONCURRENT_READS, len(reads)))) as pool:
        return list(pool.map(lambda read: read(), reads))
