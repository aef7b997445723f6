"""Return the capacity of DAG runs that are gone: the safety net behind the teardown.

A worker killed by SIGKILL or the OOM killer while claiming runs no ``on_kill``, and Airflow
skips a teardown whose setup failed, so nodes can stay claimed after their DAG run ended.
``reap`` finds every run that holds something (a node's ``trainops.io/claimed-by``, a grant on
the training ClusterQueue, an attempt still running in the training namespace), asks
``alive(run)`` whether its DAG run is still queued or running, and gives back
(``procedure.give_back``: it stops the run's training first, through the run's own
``TrainingRun`` reconcile, recording the stop on its attempts) what each run that is not holds,
once its claim is older than ``grace_s``. ``alive`` answers True, False, or None (unknown: never
reaped on a guess).

    reap(kube, AirflowRuns(url, token).alive, cluster_queue="training", grace_s=600)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

from trainops.capacity.claims import claim_age_s, parse_run
from trainops.capacity.inference import loans_by_run
from trainops.capacity.procedure import Deadlines, give_back
from trainops.capacity.quota import grants_of
from trainops.errors import PermanentError
from trainops.kube import kueue
from trainops.kube.client import Kube
from trainops.kube.nodes import holder_of, list_nodes
from trainops.kube.retry import Deadline

module_log = logging.getLogger(__name__)
ALIVE_STATES = ("queued", "running")


@dataclass
class Holding:
    """What one run holds: its claimed nodes, its quota grant, its attempts still running, and its
    oldest claim's (or running attempt's) age (None: unknown)."""

    run: str
    node_names: list[str] = field(default_factory=list)
    gpus_granted: int = 0
    running: list[str] = field(default_factory=list)
    age_s: float | None = None
    loans: list[str] = field(default_factory=list)  # inference workloads still lending to it


@dataclass
class ReapSummary:
    returned: list[str] = field(default_factory=list)  # runs whose capacity was given back
    kept: dict[str, str] = field(default_factory=dict)  # run -> why it was left alone
    failed: dict[str, str] = field(default_factory=dict)  # run -> why its return failed


def holdings(
    kube: Kube, cluster_queue: str, now: datetime, training_namespace: str | None = None
) -> dict[str, Holding]:
    """Every run holding nodes, a grant on ``cluster_queue`` (a queue that does not exist holds none),
    inference loans (a return killed after its nodes went back, e.g. with replicas still in an
    overflow pool) or, with ``training_namespace``, an attempt that still runs there."""
    held: dict[str, Holding] = {}
    for node in list_nodes(kube.core):
        annotations = node["metadata"].get("annotations") or {}
        run = holder_of(annotations)
        if run is None:
            continue
        holding = held.setdefault(run, Holding(run))
        holding.node_names.append(node["metadata"]["name"])
        age = claim_age_s(annotations, now)
        if age is not None:
            holding.age_s = max(age, holding.age_s or 0.0)
    queue = kueue.read(kube.custom, "clusterqueues", cluster_queue, Deadline(Deadlines.api_s))
    for run, grant in (grants_of(queue) if queue else {}).items():
        held.setdefault(run, Holding(run)).gpus_granted = int(grant.get("gpus", 0))
    for run, lenders in loans_by_run(kube.custom, Deadline(Deadlines.api_s)).items():
        held.setdefault(run, Holding(run)).loans = [str(ref) for ref, _ in lenders]
    for run, job, created in _running_attempts(kube, training_namespace) if training_namespace else ():
        holding = held.setdefault(run, Holding(run))
        holding.running.append(job)
        if created is not None:
            holding.age_s = max((now - created).total_seconds(), holding.age_s or 0.0)
    return held


def _running_attempts(kube: Kube, namespace: str) -> list[tuple[str, str, datetime | None]]:
    """``(run, Job, created)`` of every unfinished training attempt in ``namespace`` (by the run label)."""
    from trainops.kube.client import JOBS
    from trainops.training.job import DAG_RUN_ANNOTATION, RUN_LABEL, finished

    found = []
    for job in kube.list(JOBS, namespace, labels=RUN_LABEL):
        meta = job["metadata"]
        run = (meta.get("annotations") or {}).get(DAG_RUN_ANNOTATION)
        if run and "/" in run and not finished(job):
            created = meta.get("creationTimestamp")
            found.append((run, meta["name"], datetime.fromisoformat(created) if created else None))
    return found


def reap(
    kube: Kube,
    alive: Callable[[str], bool | None],
    *,
    cluster_queue: str,
    grace_s: float,
    training_namespace: str | None = "training",
    wave_nodes: int | None = None,
    dry_run: bool = False,
    deadlines: Deadlines | None = None,
    now: datetime | None = None,
    log: logging.Logger = module_log,
) -> ReapSummary:
    """Give back what runs that are no longer alive hold (see the module docstring), their training
    Jobs in ``training_namespace`` stopped first (a worker killed mid-``train`` leaves its Job running);
    ``wave_nodes``: as ``give_back``'s.  A return killed halfway is resumed by the next ``reap``."""
    if not grace_s >= 0:
        raise ValueError(f"grace_s must be >= 0 seconds, got {grace_s!r}")
    summary = ReapSummary()
    found = holdings(kube, cluster_queue, now or datetime.now(UTC), training_namespace)
    for run, holding in sorted(found.items()):
        held = (
            f"{len(holding.node_names)} node(s), {holding.gpus_granted} GPUs of quota, "
            f"{len(holding.loans)} inference loan(s), {len(holding.running)} running attempt(s)"
        )
        if holding.age_s is not None and holding.age_s < grace_s:
            summary.kept[run] = f"claimed {holding.age_s:.0f}s ago, within the {grace_s:g}s grace period"
            continue
        state = alive(run)
        if state is None:
            summary.kept[run] = "Airflow could not say whether its DAG run is alive"
        elif state:
            summary.kept[run] = "its DAG run is queued or running"
        elif dry_run:
            summary.kept[run] = f"dry run: would return {held}"
        else:
            log.warning("run %s is no longer running but holds %s: returning it", run, held)
            try:
                give_back(
                    kube,
                    run,
                    cluster_queue=cluster_queue,
                    training_namespace=training_namespace,
                    wave_nodes=wave_nodes,
                    deadlines=deadlines or Deadlines(),
                    log=log,
                )
            except Exception as error:  # reap the other runs
                summary.failed[run] = f"{type(error).__name__}: {error}"
                continue
            summary.returned.append(run)
        if run not in summary.returned:
            log.info("run %s (%s) kept: %s", run, held, summary.kept.get(run))
    return summary


class AirflowRuns:
    """Which DAG runs are alive, from Airflow's REST API (``GET /api/v2/dags/{dag_id}/dagRuns/{run_id}``)."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise PermanentError(
                f"airflow_url: {base_url!r} is not an http(s) URL, e.g. http://localhost:8080"
            )
        self.base_url, self.token, self.timeout_s = base_url.rstrip("/"), token, timeout_s

    def alive(self, run: str) -> bool | None:
        """True while the DAG run is queued or running, False when it ended or does not exist,
        None when the API cannot tell (unreachable, unauthorized, an unexpected answer)."""
        import requests

        dag_id, _, run_id = parse_run(run).partition("/")
        url = f"{self.base_url}/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = requests.get(url, headers=headers, timeout=self.timeout_s)
        except requests.RequestException as error:
            module_log.warning("asking Airflow about %s failed: %s", run, error)
            return None
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            module_log.warning(
                "Airflow answered %d about %s: %s", response.status_code, run, response.text[:200]
            )
            return None
        try:
            state = response.json().get("state")
        except ValueError:
            return None
        return state in ALIVE_STATES if isinstance(state, str) else None
