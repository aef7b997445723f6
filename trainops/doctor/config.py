"""What the doctor is given (``DoctorConfig``: what trainops is set up to use) and what a check is
(``Check``: a name, a few words on what it checks, and the function that checks it).  ``checks``
lists the checks, ``runner`` runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome
from trainops.health.gate import DEFAULT_SELECTOR
from trainops.health.prometheus import PrometheusClient
from trainops.permissions import ACCOUNTS, WORKER

CHECK_DEADLINE_S = 30.0


@dataclass(frozen=True)
class DoctorConfig:
    """What trainops is set up to use (the lifecycle's defaults), and how long each check may take.

    ``probe_daemon_set``: ``<namespace>/<name>`` of the node probe's DaemonSet.  ``account``: whose
    permissions (``trainops.permissions``) to ask for, as the caller: ``worker``, ``triggerer`` or
    ``api-server``.  ``prometheus``: the Prometheus that scrapes dcgm-exporter (None: not checked)."""

    selector: str = DEFAULT_SELECTOR
    training_namespace: str = "training"
    cluster_queue: str = "training"
    local_queue: str = "training"
    priority_class: str = "training-standard"
    probe_daemon_set: str = "kube-system/trainops-node-probe"
    prometheus: PrometheusClient | None = None
    account: str = WORKER
    check_deadline_s: float = CHECK_DEADLINE_S

    def __post_init__(self) -> None:
        namespace, _, name = self.probe_daemon_set.partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(
                f"probe_daemon_set must be <namespace>/<name>, e.g. kube-system/trainops-node-probe, "
                f"got {self.probe_daemon_set!r}"
            )
        if self.account not in ACCOUNTS:
            raise ValueError(f"account must be one of {', '.join(ACCOUNTS)}, got {self.account!r}")
        if not self.check_deadline_s > 0:
            raise ValueError(f"check_deadline_s must be > 0 seconds, got {self.check_deadline_s!r}")

    @property
    def probe(self) -> tuple[str, str]:
        namespace, _, name = self.probe_daemon_set.partition("/")
        return namespace, name


@dataclass(frozen=True)
class Check:
    name: str
    about: str  # what it checks, in a few words
    run: Callable[[Reads, DoctorConfig], Outcome]
