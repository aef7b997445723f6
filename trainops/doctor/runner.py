"""Running the checks: each in a thread of its own with a deadline, so one slow or failing check
fails alone, with its reason, and the others still answer.  ``run_doctor`` first asks the API
server its version: when that fails the cluster cannot be read at all (``ClusterUnreachable``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from trainops.doctor.config import Check, DoctorConfig
from trainops.doctor.reads import Reads
from trainops.doctor.result import FAILED, OK, PROBLEM, SKIPPED, Finding, Problem, Report, Skip
from trainops.errors import PermanentError
from trainops.kube.client import api_message, is_denied
from trainops.kube.retry import Deadline

JOIN_GRACE_S = 2.0  # a check's reads end at its deadline; this covers the thread's own wrap-up


class ClusterUnreachable(PermanentError):
    """The API server cannot be reached, or does not accept these credentials."""


def run_doctor(kube, config: DoctorConfig, checks: Sequence[Check] | None = None) -> Report:
    """Every check (default: ``trainops.doctor.checks.CHECKS``) against the cluster behind ``kube`` (a
    ``Kube``); reads only.  Raises ``ClusterUnreachable`` when the API server cannot be read at all."""
    from trainops.doctor.checks import CHECKS

    checks = CHECKS if checks is None else checks
    server = kube.api_client.configuration.host
    reads = Reads(kube, Deadline(config.check_deadline_s))
    try:
        version = reads.get_path("/version", "the API server's version") or {}
    except Exception as error:
        raise ClusterUnreachable(
            f"cannot read the cluster at {server}: {api_message(error)}; check the kubeconfig, its "
            "context and credentials (--kubeconfig, --context), and that the API server is reachable"
        ) from None
    findings: dict[str, Finding] = {}
    threads = [
        threading.Thread(
            target=_run_one,
            args=(check, reads.for_check(Deadline(config.check_deadline_s)), config, findings),
            name=f"doctor-{check.name}",
            daemon=True,  # a check stuck past its deadline does not hold the process
        )
        for check in checks
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + config.check_deadline_s + JOIN_GRACE_S - time.monotonic()))
    late = Problem(
        f"did not finish within {config.check_deadline_s:g}s",
        "the API server or Prometheus answers slowly: run again, or give it longer (--check-deadline)",
    )
    return Report(
        f"{server} (Kubernetes {version.get('gitVersion', 'version unknown')})",
        tuple(
            findings.get(c.name) or Finding(c.name, FAILED, late.what, (late,), config.check_deadline_s)
            for c in checks
        ),
    )


def _run_one(check: Check, reads: Reads, config: DoctorConfig, findings: dict[str, Finding]) -> None:
    started = time.monotonic()
    try:
        outcome = check.run(reads, config)
        finding = Finding(
            check.name, PROBLEM if outcome.problems else OK, outcome.summary, tuple(outcome.problems)
        )
    except Skip as skip:
        finding = Finding(check.name, SKIPPED, str(skip))
    except Exception as error:
        problem = _failure(error, config)
        finding = Finding(check.name, FAILED, problem.what, (problem,))
    findings[check.name] = replace(finding, seconds=time.monotonic() - started)


def _failure(error: Exception, config: DoctorConfig) -> Problem:
    """Why a check could not finish, and what to do."""
    if is_denied(error):
        return Problem(
            f"the API refused a read: {api_message(error)}",
            "run the doctor with credentials that may read it (an admin's kubeconfig, or the account "
            "deploy/doctor-rbac.yaml binds)",
        )
    if isinstance(error, TimeoutError):  # DeadlineExceeded, or a shared read that took too long
        return Problem(
            f"did not finish within {config.check_deadline_s:g}s: {error or 'a read it waited for'}",
            "the API server or Prometheus answers slowly: run again, or give it longer (--check-deadline)",
        )
    return Problem(
        f"could not finish: {type(error).__name__}: {api_message(error)[:500]}",
        "fix what the error names and run again",
    )
