"""Deterministic, DNS-1123 names for a run's Jobs: the same DAG run and attempt always give the same name."""

from __future__ import annotations

import hashlib
import re

# An Indexed Job's pods get the hostname ``<job>-<index>``, which must be a DNS-1123 label (<= 63),
# so the Job name leaves room for a five-digit index.
MAX_JOB_NAME = 57
PREFIX = "train"
_INVALID = re.compile(r"[^a-z0-9]+")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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
