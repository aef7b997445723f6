"""Synchronous cluster calls of the operator (``kubernetes`` client): submit, find and inspect Jobs,
and blame nodes.  Transient API errors are retried until a deadline (``trainops.kube.retry``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from trainops.kube.retry import Deadline, call
from trainops.training.job import JOB_NAME_LABEL, RUN_LABEL
from trainops.training.kube import KUEUE_GROUP, KUEUE_VERSION, MERGE_PATCH, WORKLOADS

log = logging.getLogger(__name__)
API_DEADLINE_S = 120.0
LOG_TAIL_LINES = 100
MAX_CONCURRENT_READS = 8


def _json(response) -> dict:
    return json.loads(response.data)


class GangCluster:
    """``core``/``batch``: ``kubernetes.client.CoreV1Api`` / ``BatchV1Api``."""

    def __init__(self, core, batch) -> None:
        self.core, self.batch = core, batch

    def read_job(self, namespace: str, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return call(
                lambda: _json(self.batch.read_namespaced_job(name, namespace, _preload_content=False)),
                Deadline(API_DEADLINE_S),
                f"read Job {namespace}/{name}",
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_job(self, job: dict) -> tuple[dict, bool]:
        """Create the Job; returns it and whether this call created it (False: it already existed)."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            created = call(
                lambda: _json(self.batch.create_namespaced_job(namespace, job, _preload_content=False)),
                Deadline(API_DEADLINE_S),
                f"create Job {namespace}/{name}",
            )
            return created, True
        except ApiException as error:
            if error.status != 409:
                raise
        existing = self.read_job(namespace, name)
        if existing is None:
            raise RuntimeError(f"Job {namespace}/{name} reported as existing but cannot be read")
        return existing, False

    def create_service(self, service: dict) -> bool:
        """Create a Service; False when it already existed."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
        try:
            call(
                lambda: self.core.create_namespaced_service(namespace, service, _preload_content=False),
                Deadline(API_DEADLINE_S),
                f"create Service {namespace}/{name}",
            )
        except ApiException as error:
            if error.status != 409:
                raise
            return False
        return True

    def deactivate_workload(self, namespace: str, name: str) -> bool:
        """Stop a run through its Kueue Workload (``spec.active=false``: Kueue evicts it and does not
        requeue it); False when that Workload no longer exists."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        custom = client.CustomObjectsApi(self.core.api_client)
        try:
            call(
                lambda: custom.patch_namespaced_custom_object(
                    KUEUE_GROUP,
                    KUEUE_VERSION,
                    namespace,
                    WORKLOADS,
                    name,
                    {"spec": {"active": False}},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                ),
                Deadline(API_DEADLINE_S),
                f"deactivate Workload {namespace}/{name}",
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return False
        return True

    def run_jobs(self, namespace: str, run_key: str) -> list[dict]:
        """Every Job of one DAG run (all attempts)."""
        response = call(
            lambda: self.batch.list_namespaced_job(
                namespace, label_selector=f"{RUN_LABEL}={run_key}", _preload_content=False
            ),
            Deadline(API_DEADLINE_S),
            "list the run's Jobs",
        )
        return _json(response)["items"]

    def job_pods(self, namespace: str, name: str) -> list[dict]:
        response = call(
            lambda: self.core.list_namespaced_pod(
                namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _preload_content=False
            ),
            Deadline(API_DEADLINE_S),
            f"list the pods of Job {name}",
        )
        return _json(response)["items"]

    def failure_evidence(
        self, namespace: str, pods: list[Mapping]
    ) -> tuple[dict[str, dict | None], dict[str, str]]:
        """What a failure is judged on, read concurrently: the nodes the pods ran on (None for a node
        that no longer exists) and the last lines of each failed pod's log (pods already gone are
        skipped)."""
        names = sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
        failed = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
        reads = [lambda n=n: self._node(n) for n in names] + [
            lambda p=p: self._log_tail(namespace, p) for p in failed
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_CONCURRENT_READS, len(reads)))) as pool:
            results = list(pool.map(lambda read: read(), reads))
        tails = {
            pod: tail for pod, tail in zip(failed, results[len(names) :], strict=True) if tail is not None
        }
        return dict(zip(names, results[: len(names)], strict=True)), tails

    def _node(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return call(
                lambda: _json(self.core.read_node(name, _preload_content=False)),
                Deadline(API_DEADLINE_S),
                f"read node {name}",
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return None

    def _log_tail(self, namespace: str, pod: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod_log(pod, namespace, tail_lines=LOG_TAIL_LINES)
        except ApiException as error:
            log.info("no log for pod %s (%s)", pod, error.status)
            return None
