"""The FastAPI app mounted at ``/trainops``: the views' modules, and the JSON API they call.

Settings (``[trainops]`` in airflow.cfg, or ``AIRFLOW__TRAINOPS__<KEY>``): ``kubernetes_conn_id``
(default ``kubernetes_default``), ``aws_conn_id`` (``aws_default``), ``cluster_queue``
(``training``), ``training_namespace`` (``training``: where the attempts' Jobs are),
``prometheus_conn_id`` (none: no tensor-core activity in the fleet view, and releases re-check with
the node probe's report alone; else a ``trainops_prometheus`` connection, as the health gate's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, status
from fastapi.responses import RedirectResponse, Response
from trainops.plugins.auth import current_user, require_dag_run
from trainops.plugins.links import FLEET_ROUTE, run_path

User = Annotated[Any, Depends(current_user)]
VIEW_DEADLINE_S = (
    15.0  # the run view waits this long for each of its reads of the cluster, then shows it without
)
# The two React apps (ES modules the Airflow UI imports) and what they share
STATIC = {
    "fleet.js": "text/javascript",
    "run.js": "text/javascript",
    "common.js": "text/javascript",
    "gpu.svg": "image/svg+xml",
}

app = FastAPI(title="trainops", description="GPU fleet and training runs", docs_url=None, redoc_url=None)


def setting(key: str, default: str | None) -> str | None:
    from airflow.configuration import conf

    return conf.get("trainops", key, fallback=default)


def kube():
    """The cluster's clients; 503 naming the setting to fix when the connection is missing or unusable."""
    from airflow.exceptions import AirflowNotFoundException
    from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

    from trainops.kube.client import KubeconfigError

    conn_id = setting("kubernetes_conn_id", "kubernetes_default")
    try:
        return KubernetesClusterHook(conn_id=conn_id).kube()
    except AirflowNotFoundException:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"no Airflow connection {conn_id!r}: create it, or name another in [trainops] kubernetes_conn_id",
        ) from None
    except KubeconfigError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None


class PrometheusUnusable(Exception):
    """[trainops] prometheus_conn_id names a connection that cannot be used; the message says how to fix it."""


def prometheus():
    """A query client on the ``trainops_prometheus`` connection named by ``[trainops] prometheus_conn_id``
    (the health gate's ``PrometheusHook``); None when the setting is empty."""
    from airflow.exceptions import AirflowNotFoundException
    from trainops.hooks.prometheus import PrometheusHook

    conn_id = setting("prometheus_conn_id", None)
    if not conn_id:
        return None
    try:
        return PrometheusHook(conn_id).client()
    except AirflowNotFoundException:
        raise PrometheusUnusable(
            f"no Airflow connection {conn_id!r}: create it (type trainops_prometheus), or name another "
            "in [trainops] prometheus_conn_id, or leave that setting empty"
        ) from None


@contextmanager
def cluster_answers() -> Iterator[None]:
    """A route's cluster calls: a refusal (e.g. RBAC's 403 to the API server's identity) or an API server
    that stays down is a 502 with what the cluster said, which the pages show, instead of a bare 500."""
    from kubernetes.client.exceptions import ApiException

    from trainops.kube.client import api_message
    from trainops.kube.retry import DeadlineExceeded

    try:
        yield
    except ApiException as error:
        raise HTTPException(
            status.HTTP_502_BAD_GATEWAY, f"the cluster answered {error.status}: {api_message(error)}"
        ) from None
    except DeadlineExceeded as error:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"the cluster did not answer: {error}") from None


def _asset(name: str) -> str:
    return resources.files("trainops.plugins").joinpath("static", name).read_text()


@app.get("/fleet", include_in_schema=False)
def fleet_page() -> RedirectResponse:
    """The fleet view is a page of the Airflow UI (``plugin.py``); relative, so any base URL works."""
    return RedirectResponse(f"../plugin/{FLEET_ROUTE}")


@app.get("/runs/{dag_id}/{run_id}", include_in_schema=False)
def run_page(dag_id: str, run_id: str) -> RedirectResponse:
    """The run view is a tab of the DAG run in the Airflow UI."""
    return RedirectResponse("../../.." + run_path(dag_id, run_id))


@app.get("/static/{name}", include_in_schema=False)
def static_file(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no file {name}")
    return Response(_asset(name), media_type=STATIC[name])


def _json(value: Any) -> Response:
    """Encoded once with ``json.dumps`` (plain JSON types already): FastAPI's generic encoder walks
    every value of 4,096 rows again and would cost more than the rows themselves."""
    return Response(json.dumps(value, separators=(",", ":")), media_type="application/json")


@app.get("/api/fleet")
def get_fleet(user: User) -> Response:
    """Every GPU node: mode, holder, health verdict and reasons, quarantine; counts by state.
    For users who may read DAG runs: the holders are DAG runs."""
    from trainops.plugins.fleet import cluster_fleet

    require_dag_run(user, "GET")
    with cluster_answers():
        return _json(cluster_fleet(kube()))


@app.get("/api/fleet/tensor-activity")
def get_tensor_activity(user: User) -> Response:
    """``{"configured", "error", "nodes": {node: 0-1}}``: each node's tensor-core activity, from one
    Prometheus query, answered apart from the fleet so that a slow Prometheus never holds it back.
    Not configured (no ``[trainops] prometheus_conn_id``): empty, not an error; Prometheus unusable:
    empty with the reason."""
    from trainops.plugins.fleet import tensor_activity

    from trainops.health.prometheus import PrometheusError

    require_dag_run(user, "GET")
    answer: dict[str, Any] = {"configured": True, "error": None, "nodes": {}}
    try:
        client = prometheus()
        if client is None:
            answer["configured"] = False
        else:
            answer["nodes"] = tensor_activity(client)
    except (PrometheusUnusable, PrometheusError) as error:
        answer["error"] = str(error)[:500]
    except (KeyError, TypeError, AttributeError) as error:  # an answer that is not a Prometheus one
        answer["error"] = f"Prometheus answered something unexpected ({type(error).__name__}: {error})"[:500]
    return _json(answer)


@app.get("/api/runs/{dag_id}/{run_id}")
def get_run(dag_id: str, run_id: str, user: User) -> dict:
    """The run view: attempt ledger, checkpoints as verified now, progress (heartbeat, rate, the
    plot's data), capacity claimed and returned."""
    from airflow.utils.session import create_session
    from trainops.plugins.runs import RunNotFound, run_view

    require_dag_run(user, "GET", dag_id)
    try:
        with create_session() as session:
            return run_view(
                session,
                dag_id,
                run_id,
                setting("aws_conn_id", "aws_default"),
                lambda: run_ledger(dag_id, run_id),
            )
    except RunNotFound as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from None


@app.get("/api/runs/{dag_id}/{run_id}/inference")
def get_run_inference(dag_id: str, run_id: str, user: User) -> dict:
    """The inference workloads the run borrows from: Ready replicas by pool (primary and overflow), now."""
    from trainops.plugins.serving import serving

    from trainops.kube.retry import Deadline

    require_dag_run(user, "GET", dag_id)
    with cluster_answers():
        return {"workloads": serving(kube(), f"{dag_id}/{run_id}", Deadline(VIEW_DEADLINE_S))}


def run_ledger(dag_id: str, run_id: str) -> dict:
    """The run's attempt ledger, read from its Jobs in ``[trainops] training_namespace`` exactly as the
    run's own tries and trigger read it (``TrainingRun.observe``: it reads, it never acts); Unavailable
    with the cluster's answer when it cannot be read."""
    from trainops.plugins.progress import Unavailable

    from trainops.training.cluster import GangCluster
    from trainops.training.reconcile import TrainingRun

    namespace = setting("training_namespace", "training")
    try:
        with cluster_answers():
            cluster = kube()
            fast = cluster.with_settings(cluster.settings.with_deadline(VIEW_DEADLINE_S))
            return TrainingRun(GangCluster(fast), namespace, dag_id, run_id).observe().to_dict()
    except HTTPException as error:
        raise Unavailable(f"{error.detail} (the attempt ledger is read from the run's Jobs)") from None


def _confirmed(confirm: str | None, expected: str) -> None:
    if confirm != expected:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"confirm must be {expected!r} to confirm this action (got {confirm!r}); nothing was changed",
        )


@app.post("/api/nodes/{node}/release")
def post_release(node: str, user: User, confirm: Annotated[str | None, Body(embed=True)] = None) -> dict:
    """Re-check a quarantined node (``trainops health release``) and release it if it passes."""
    from trainops.plugins.actions import release_node

    from trainops.health.gate import GateError
    from trainops.health.quarantine import ReleaseRefused

    require_dag_run(user, "PUT")
    _confirmed(confirm, node)
    try:
        client = prometheus()
    except PrometheusUnusable as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    with cluster_answers():
        try:
            return release_node(kube(), node, user.get_name(), client)
        except (ReleaseRefused, GateError) as error:
            raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None


@app.post("/api/runs/{dag_id}/{run_id}/return")
def post_return(
    dag_id: str, run_id: str, user: User, confirm: Annotated[str | None, Body(embed=True)] = None
) -> dict:
    """Return every node and loan the run holds (``trainops capacity return``)."""
    from trainops.plugins.actions import return_capacity

    from trainops.errors import TrainopsError

    require_dag_run(user, "PUT", dag_id)
    run = f"{dag_id}/{run_id}"
    _confirmed(confirm, run)
    with cluster_answers():
        try:
            return return_capacity(
                kube(),
                run,
                user.get_name(),
                setting("cluster_queue", "training"),
                setting("training_namespace", "training"),
            )
        except ValueError as error:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from None
        except TrainopsError as error:
            raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
