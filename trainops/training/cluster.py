"""Synchronous cluster calls of the operator (``kubernetes`` client): submit, find and inspect Jobs,
and blame nodes.  Transient API errors are retried until a deadline (``trainops.cluster.retry``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from trainops.cluster.retry import Deadline, call
from trainops.training.job import JOB_NAME_LABEL, RUN_LABEL

log = logging.getLogger(__name__)
API_DEADLINE_S = 120.0
LOG_TAIL_LINES = 100


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

    def create_job(self, job) -> tuple[dict, bool]:
        """Create the Job; returns it and whether this call created it (False: it already existed)."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = job.metadata.namespace, job.metadata.name
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

    def nodes(self, names: set[str]) -> dict[str, dict | None]:
        """The named nodes (None for a node that no longer exists)."""
        from kubernetes.client.exceptions import ApiException

        found: dict[str, dict | None] = {}
        for name in sorted(names):
            try:
                found[name] = call(
                    lambda name=name: _json(self.core.read_node(name, _preload_content=False)),
                    Deadline(API_DEADLINE_S),
                    f"read node {name}",
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                found[name] = None
        return found

    def log_tails(self, namespace: str, pods: list[Mapping]) -> dict[str, str]:
        """The last lines of each failed pod's log (pods already gone are skipped)."""
        from kubernetes.client.exceptions import ApiException

        tails = {}
        for pod in pods:
            if (pod.get("status") or {}).get("phase") != "Failed":
                continue
            name = pod["metadata"]["name"]
            try:
                tails[name] = self.core.read_namespaced_pod_log(name, namespace, tail_lines=LOG_TAIL_LINES)
            except ApiException as error:
                log.info("no log for pod %s (%s)", name, error.status)
        return tails
