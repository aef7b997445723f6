"""The Airflow services stack, described once: each service's command and environment.

Two renderings use it: ``make up`` (:mod:`trainops_devcluster.stack`, processes on this machine)
and ``docker-compose.yaml`` (containers; a test checks the file against :data:`COMPOSE`). Only the
:class:`Endpoints` differ: where PostgreSQL, Redis, S3 and the devcluster are, and on which ports.

The login, the JWT secret and the S3 keys are local-only defaults for a playground on loopback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainops_devcluster.local_s3 import ACCESS_KEY, REGION, SECRET_KEY

ADMIN_USER = "admin"
DEFAULT_ADMIN_PASSWORD = "admin"  # local only; `make up` takes TRAINOPS_ADMIN_PASSWORD
JWT_SECRET = "trainops-local-jwt-secret"  # one secret for every component (local only)
API_SECRET_KEY = "trainops-local-api-secret-key"
DB_URL = "airflow:airflow@{postgres}/airflow"
BUCKET = "trainops-demo"  # the lifecycle DAGs' default checkpoint bucket
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"

# Airflow component -> its `airflow` subcommand. Everything else comes from the environment.
# No log servers: `airflow serve-logs` (which the worker and the triggerer would start) binds every
# interface, and Airflow 3.3 has no setting for its host (airflow/utils/serve_logs/core.py binds "").
# Every component writes to one log folder (`make up`: one machine; compose: the airflow-logs volume),
# which the API server reads, for running and deferred tasks too.
AIRFLOW_COMMANDS: dict[str, list[str]] = {
    "airflow-apiserver": ["api-server"],
    "airflow-scheduler": ["scheduler"],
    "airflow-dag-processor": ["dag-processor"],
    "airflow-triggerer": ["triggerer", "--skip-serve-logs"],
    "airflow-worker": ["celery", "worker", "--skip-serve-logs"],
}
LOOPBACK = "127.0.0.1"  # where every listener of the stack binds (the API server too, natively)

# Airflow component -> the ServiceAccount it runs as: the official Helm chart's, for a release
# `airflow` in namespace `airflow`. Each gets its own token and so its own `kubernetes_default`.
# deploy/rbac.yaml grants the worker (tasks), the triggerer (deferred waits) and the API server (the
# UI plugin); the scheduler and the dag-processor run no trainops code that calls the cluster, so
# their accounts have no grants (and tests/services/test_least_privilege.py checks they call nothing).
AIRFLOW_NAMESPACE = "airflow"
SERVICE_ACCOUNTS: dict[str, str] = {
    "airflow-apiserver": "airflow-api-server",
    "airflow-scheduler": "airflow-scheduler",
    "airflow-dag-processor": "airflow-dag-processor",
    "airflow-triggerer": "airflow-triggerer",
    "airflow-worker": "airflow-worker",
}
# The UI plugin's tensor-core column reads this connection (defined for every component below).
PLUGIN_SETTINGS = {"airflow-apiserver": {"AIRFLOW__TRAINOPS__PROMETHEUS_CONN_ID": "prometheus_default"}}


@dataclass(frozen=True)
class Endpoints:
    """Where one stack's parts are reached, and its paths."""

    postgres: str  # host:port
    redis: str  # host:port
    s3_url: str
    devcluster_port: int
    state: str  # the devcluster's kubeconfigs (admin, ServiceAccounts) and the login's passwords file
    home: str  # AIRFLOW_HOME
    dags: str
    deploy: str  # the repository's deploy/ (rbac.yaml), applied to the devcluster at its start
    api_bind: str = LOOPBACK
    api_port: int = 8080
    scheduler_health_port: int = 8974
    prometheus_port: int = 9090  # the devcluster's Prometheus (Debian's), scraping its nodes' dcgm-exporter
    devcluster_nodes: int = 8

    @property
    def api_url(self) -> str:
        return f"http://localhost:{self.api_port}"

    @property
    def devcluster_url(self) -> str:
        return f"http://127.0.0.1:{self.devcluster_port}"

    @property
    def kubeconfig(self) -> str:
        return f"{self.state}/kubeconfig"

    @property
    def passwords_file(self) -> str:
        return f"{self.state}/passwords.json"

    @property
    def rbac(self) -> str:
        return f"{self.deploy}/rbac.yaml"

    def account_kubeconfig(self, service: str) -> str:
        """The kubeconfig of ``service``'s ServiceAccount (a token the devcluster hands out at start)."""
        return f"{self.state}/{SERVICE_ACCOUNTS[service]}.kubeconfig"


# The containers share one network namespace with the devcluster (it binds loopback only), so the
# devcluster, its Prometheus and the scheduler's health check are on localhost there too (only the API
# server binds every interface of it, to be published); PostgreSQL, Redis and
# MinIO are services of their own.
COMPOSE = Endpoints(
    postgres="postgres:5432",
    redis="redis:6379",
    s3_url="http://minio:9000",
    devcluster_port=6443,
    state="/opt/airflow/state",
    home="/opt/airflow",
    dags="/opt/airflow/dags",
    deploy="/opt/airflow/deploy",
    api_bind="0.0.0.0",
)


def airflow_environment(at: Endpoints) -> dict[str, str]:
    """What every Airflow component's environment has (and all of ``airflow db migrate``'s): no
    cluster access; :func:`service_environment` adds each component's own."""
    return {
        "AIRFLOW_HOME": at.home,
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",  # user:role
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": at.passwords_file,
        "AIRFLOW__CORE__DAGS_FOLDER": at.dags,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "true",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://" + DB_URL.format(postgres=at.postgres),
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+postgresql://" + DB_URL.format(postgres=at.postgres),
        "AIRFLOW__CELERY__BROKER_URL": f"redis://:@{at.redis}/0",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "8",
        "AIRFLOW__API__HOST": at.api_bind,
        "AIRFLOW__API__PORT": str(at.api_port),
        "AIRFLOW__API__BASE_URL": at.api_url,
        "AIRFLOW__API__SECRET_KEY": API_SECRET_KEY,
        "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{at.api_url}/execution/",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "true",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOOPBACK,  # Airflow's default: 0.0.0.0
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(at.scheduler_health_port),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
            {
                "conn_type": "aws",
                "login": ACCESS_KEY,
                "password": SECRET_KEY,
                "extra": {"endpoint_url": at.s3_url, "region_name": REGION},
            }
        ),
        "AIRFLOW_CONN_PROMETHEUS_DEFAULT": json.dumps(
            {"conn_type": "http", "host": f"http://127.0.0.1:{at.prometheus_port}"}
        ),
    }


def service_environment(at: Endpoints, service: str) -> dict[str, str]:
    """The environment of Airflow component ``service``: :func:`airflow_environment`, its own
    ``kubernetes_default`` (its ServiceAccount's kubeconfig) and its plugin settings."""
    kubernetes = {"conn_type": "kubernetes", "extra": {"kube_config_path": at.account_kubeconfig(service)}}
    return {
        **airflow_environment(at),
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(kubernetes),
        **PLUGIN_SETTINGS.get(service, {}),
    }


def s3_environment(at: Endpoints) -> dict[str, str]:
    """What points boto3 (and the trainer's checkpoint helper) at the stack's S3 server."""
    return {
        "AWS_ENDPOINT_URL_S3": at.s3_url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }


def devcluster_command(at: Endpoints) -> list[str]:
    """The devcluster; its pods (the trainers) run as its child processes with its environment. At
    start it applies deploy/rbac.yaml and writes each Airflow component's ServiceAccount kubeconfig
    (the last one written is the sign that all are there)."""
    accounts = [
        f"--service-account={AIRFLOW_NAMESPACE}/{account}={at.account_kubeconfig(service)}"
        for service, account in SERVICE_ACCOUNTS.items()
    ]
    return [
        "trainops",
        "devcluster",
        "up",
        "--port",
        str(at.devcluster_port),
        "--nodes",
        str(at.devcluster_nodes),
        "--prometheus-port",
        str(at.prometheus_port),
        "--kubeconfig",
        at.kubeconfig,
        "--apply",
        at.rbac,
        *accounts,
    ]


def passwords(admin_password: str) -> str:
    """The SimpleAuthManager passwords file (written before the API server first starts)."""
    return json.dumps({ADMIN_USER: admin_password})
