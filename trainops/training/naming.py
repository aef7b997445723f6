"""Deterministic, DNS-1123 names for a run's Jobs: the same DAG run and attempt always give the same name;
and the run's own name and run path (``<checkpoint_uri>/<run_name>/``, which ``trainops.checkpoints.owner``
reserves for one DAG run), a name derived from the DAG run when the user gave none."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime

from trainops.checkpoints.uri import S3Uri

# An Indexed Job's pods get the hostname ``<job>-<index>``, which must be a DNS-1123 label (<= 63),
# so the Job name leaves room for a five-digit index.
MAX_JOB_NAME = 57
PREFIX = "train"
_INVALID = re.compile(r"[^a-z0-9]+")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_RUN_NAME = 63  # a DNS-1123 label: run names also name Kubernetes objects and label values


def run_key(dag_id: str, run_id: str) -> str:
    """A short stable hash of the DAG run; the label value that ties every attempt's Job to it."""
    return hashlib.sha256(f"{dag_id}\0{run_id}".encode()).hexdigest()[:10]


def slug(text: str) -> str:
    """Lower-case letters and digits joined by single dashes."""
    return _INVALID.sub("-", text.lower()).strip("-")


def job_name(dag_id: str, run_id: str, attempt: int) -> str:
    """``train-<dag>-<run>-<hash>-a<attempt>``, shortened to fit; unique per (dag_id, run_id, attempt)."""
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    tail = f"-{run_key(dag_id, run_id)}-a{attempt}"
    readable = slug(f"{dag_id}-{run_id}")[: MAX_JOB_NAME - len(PREFIX) - 1 - len(tail)].strip("-")
    return f"{PREFIX}-{readable}{tail}" if readable else f"{PREFIX}{tail}"


def check_dns_label(value: str, field: str) -> str:
    """``value`` when it is a DNS-1123 label (lower-case alphanumerics and '-', <= 63), else a clear error."""
    if not isinstance(value, str) or len(value) > 63 or not DNS_1123_LABEL.match(value):
        raise ValueError(
            f"{field} must be a DNS-1123 label (lower-case letters, digits and '-', starting and ending "
            f"with a letter or digit, at most 63 characters), got {value!r}"
        )
    return value


def derived_run_name(dag_id: str, run_id: str, run_after: datetime) -> str:
    """``<dag>-<YYYYmmdd-HHMMSS>-<hash>``: readable, a DNS-1123 label, and unique per DAG run (the hash
    is of ``dag_id`` and ``run_id``; the time is the run's ``run_after``, so two runs triggered in the
    same second still differ)."""
    tail = f"-{run_after:%Y%m%d-%H%M%S}-{run_key(dag_id, run_id)[:6]}"
    head = slug(dag_id)[: MAX_RUN_NAME - len(tail)].strip("-") or "run"
    return f"{head}{tail}"


def run_path(checkpoint_uri: str, run_name: str) -> str:
    """``<checkpoint_uri>/<run_name>/``; ValueError naming the field when either is malformed."""
    check_dns_label(run_name, "run_name")
    return str(S3Uri.parse(checkpoint_uri, field="checkpoint_uri").child(run_name))
