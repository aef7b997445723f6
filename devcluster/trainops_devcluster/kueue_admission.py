"""Kueue's webhooks, run by the devcluster's API server before it stores an object.

- batch/v1 Job labelled ``kueue.x-k8s.io/queue-name``: suspended at creation (Kueue unsuspends it on
  admission).  The label value must be a DNS-1123 subdomain; it may not change while the Job runs.
  The LocalQueue need not exist: the Workload then waits as ``Inadmissible``.
- ClusterQueue: each flavor lists the resources of ``coveredResources``, in that order (Kueue's CRD rule
  and webhook), and every ``nominalQuota`` must be a quantity (Kueue's CRD schema rejects others).
"""

from __future__ import annotations

import copy
import re

from trainops_devcluster.errors import Forbidden, Invalid
from trainops_devcluster.kueue_api import CLUSTER_QUEUES, JOBS, QUEUE_LABEL
from trainops_devcluster.kueue_quota import QuotaError, resource_groups

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def kueue_admission(resource: str, operation: str, obj: dict, old: dict | None) -> dict:
    """The devcluster's Admission hook for Kueue: returns the object to store, or raises."""
    if resource == JOBS:
        return _admit_job(operation, obj, old)
    if resource == CLUSTER_QUEUES:
        try:
            resource_groups(obj)
        except QuotaError as error:
            name = obj.get("metadata", {}).get("name", "")
            raise Invalid(
                "ClusterQueue.kueue.x-k8s.io", name, [(error.field, "FieldValueInvalid", error.message)]
            ) from None
    return obj


def _admit_job(operation: str, job: dict, old: dict | None) -> dict:
    labels = job.get("metadata", {}).get("labels") or {}
    if QUEUE_LABEL not in labels:
        return job
    queue = labels[QUEUE_LABEL]
    field = f"metadata.labels[{QUEUE_LABEL}]"
    if len(queue) > 253 or not _SUBDOMAIN.fullmatch(queue):
        _deny(
            f'{field}: Invalid value: "{queue}": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character "
            "(e.g. 'example.com'); name the LocalQueue in the job's namespace"
        )
    if operation == "CREATE":
        job = copy.deepcopy(job)
        job.setdefault("spec", {})["suspend"] = True
    elif old is not None:
        old_queue = (old.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL)
        running = not old.get("spec", {}).get("suspend", False)
        if running and old_queue is not None and old_queue != queue:
            _deny(f'{field}: Invalid value: "{queue}": field is immutable while the job is not suspended')
    return job


def _deny(message: str) -> None:
    raise Forbidden(f'admission webhook "vjob.kb.io" denied the request: {message}')
