"""docker-compose.yaml: valid by the Compose Specification, and the same services `make up` runs.

No container engine runs here. The schema is the one check-jsonschema vendors from compose-spec
(nothing is downloaded); the commands and environments are compared with
``trainops_devcluster.stack_spec``, which the native stack starts its processes from.
"""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from trainops_devcluster import stack_spec
from trainops_devcluster.local_s3 import ACCESS_KEY, SECRET_KEY

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
AIRFLOW_SERVICES = sorted(stack_spec.AIRFLOW_COMMANDS)
# What only a container needs: the official image's entrypoint reads it (Celery warm shutdown).
CONTAINER_ONLY_ENV = {"airflow-worker": {"DUMB_INIT_SETSID": "0"}}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # resolves the x-airflow-common anchors and merges


def compose_schema() -> dict:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(vendor.joinpath("compose-spec.json").read_text())


def test_the_file_follows_the_compose_specification(compose):
    errors = sorted(Draft202012Validator(compose_schema()).iter_errors(compose), key=lambda e: e.path)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_broken_service(compose):
    """The check is real: a misspelt key and an unknown depends_on condition are both rejected."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["airflow-scheduler"]["comand"] = "scheduler"
    broken["services"]["airflow-triggerer"]["depends_on"]["postgres"]["condition"] = "service_up"
    messages = [e.message for e in Draft202012Validator(compose_schema()).iter_errors(broken)]
    assert any("comand" in m for m in messages), messages
    assert any("'service_up'" in m for m in messages), messages


def test_the_official_services_are_all_there(compose):
    services = compose["services"]
    for name in ("postgres", "redis", "airflow-init", "devcluster", "minio", *AIRFLOW_SERVICES):
        assert name in services, f"docker-compose.yaml has no service {name}"
    for name in ("postgres", "redis", "minio", "devcluster", *AIRFLOW_SERVICES):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert "x-airflow-common" in compose
    for name in AIRFLOW_SERVICES:
        assert services[name]["user"] == "${AIRFLOW_UID:-50000}:0"
        assert services[name]["build"] == "."


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_each_airflow_service_runs_what_make_up_runs(compose, name):
    service = compose["services"][name]
    command = service["command"]
    assert (shlex.split(command) if isinstance(command, str) else command) == stack_spec.AIRFLOW_COMMANDS[
        name
    ]
    expected = {
        **stack_spec.service_environment(stack_spec.COMPOSE, name),
        **CONTAINER_ONLY_ENV.get(name, {}),
    }
    assert service["environment"] == expected
    assert service["network_mode"] == "service:devcluster"


def test_one_jwt_secret_and_the_connections_for_every_component(compose):
    envs = [compose["services"][name]["environment"] for name in (*AIRFLOW_SERVICES, "airflow-init")]
    assert len({env["AIRFLOW__API_AUTH__JWT_SECRET"] for env in envs}) == 1
    for env in envs:
        aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
        assert aws["extra"]["endpoint_url"] == "http://minio:9000"
        assert json.loads(env["AIRFLOW_CONN_PROMETHEUS_DEFAULT"])["conn_type"] == "http"


def test_each_service_reaches_the_cluster_as_its_own_service_account_and_init_not_at_all(compose):
    """Each Airflow service's kubernetes_default is its own ServiceAccount's kubeconfig, one the
    devcluster writes at start after applying deploy/rbac.yaml (mounted from the repository)."""
    services = compose["services"]
    devcluster = services["devcluster"]
    paths = {}
    for name in AIRFLOW_SERVICES:
        kube = json.loads(services[name]["environment"]["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
        paths[name] = kube["extra"]["kube_config_path"]
        account = f"{stack_spec.AIRFLOW_NAMESPACE}/{stack_spec.SERVICE_ACCOUNTS[name]}"
        assert f"--service-account={account}={paths[name]}" in devcluster["command"]
    assert len(set(paths.values())) == len(AIRFLOW_SERVICES)
    assert "AIRFLOW_CONN_KUBERNETES_DEFAULT" not in services["airflow-init"]["environment"]
    assert devcluster["command"][devcluster["command"].index("--apply") + 1] == stack_spec.COMPOSE.rbac
    assert f"./deploy:{stack_spec.COMPOSE.deploy}:ro" in devcluster["volumes"]
    # healthy only once the last kubeconfig is written: the Airflow services start after it
    assert paths["airflow-worker"] == devcluster["command"][-1].rpartition("=")[2]
    assert f"test -f {paths['airflow-worker']}" in devcluster["healthcheck"]["test"][1]
    assert services["airflow-worker"]["depends_on"]["devcluster"]["condition"] == "service_healthy"


def test_the_devcluster_and_s3_match_the_native_stack(compose):
    services = compose["services"]
    devcluster = services["devcluster"]
    assert devcluster["command"] == stack_spec.devcluster_command(stack_spec.COMPOSE)
    assert devcluster["environment"] == stack_spec.s3_environment(stack_spec.COMPOSE)
    minio = services["minio"]["environment"]
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == (ACCESS_KEY, SECRET_KEY)
    # The UI is published where the Airflow services' network namespace lives.
    assert "8080:8080" in devcluster["ports"]


def test_airflow_init_migrates_writes_the_login_and_creates_the_bucket(compose):
    init = compose["services"]["airflow-init"]
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    script = "\n".join(init["command"])
    assert stack_spec.COMPOSE.passwords_file in script
    assert '"admin": "${TRAINOPS_ADMIN_PASSWORD:-admin}"' in script
    assert "trainops_devcluster.stack bucket --endpoint http://minio:9000" in script
    depends = compose["services"]["airflow-scheduler"]["depends_on"]
    assert depends["airflow-init"]["condition"] == "service_completed_successfully"


def test_the_image_is_official_airflow_of_the_installed_minor_with_the_wheels():
    from importlib.metadata import version

    dockerfile = (ROOT / "Dockerfile").read_text()
    match = re.search(r"^FROM apache/airflow:(\d+)\.(\d+)\.\d+\s*$", dockerfile, re.M)
    assert match, "Dockerfile must start FROM apache/airflow:X.Y.Z"
    assert ".".join(match.groups()) == ".".join(version("apache-airflow").split(".")[:2])
    assert re.search(r"^COPY .*dist/\*\.whl", dockerfile, re.M)
    assert re.search(r"pip install .*\"apache-airflow==\$\{AIRFLOW_VERSION\}\"", dockerfile)
