"""Server-side apply and managedFields, driven by stock kubectl and the official client."""

from __future__ import annotations

import functools
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.devcluster.kubectl_support import kubectl as run_kubectl

APPLY = "application/apply-patch+yaml"


@pytest.fixture
def kubectl(api):
    return functools.partial(run_kubectl, api.kubeconfig, check=False)


def deployment(replicas: int = 2, labels: dict | None = None, image: str = "nginx:1.27") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", **({"labels": labels} if labels else {})},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    }


def managers(obj: dict) -> dict[str, dict]:
    return {f"{e['manager']}/{e['operation']}": e for e in obj["metadata"]["managedFields"]}


def test_kubectl_apply_server_side_creates_then_conflicts_then_forces(api, kubectl):
    first = kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(deployment(2, {"tier": "a"})))
    assert first.returncode == 0, first.stderr
    assert "serverside-applied" in first.stdout
    stored = api.store.get("deployments.apps", "default", "web")
    assert stored["spec"]["replicas"] == 2
    entry = managers(stored)["kubectl/Apply"]
    assert entry["fieldsType"] == "FieldsV1" and entry["apiVersion"] == "apps/v1"
    assert entry["fieldsV1"]["f:spec"]["f:replicas"] == {}
    containers = entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert containers['k:{"name":"web"}']["f:image"] == {} and "." in containers['k:{"name":"web"}']

    other = kubectl(
        "apply", "--server-side", "--field-manager=ci", "-f", "-", stdin=yaml.safe_dump(deployment(5))
    )
    assert other.returncode != 0
    assert 'conflict with "kubectl": .spec.replicas' in other.stderr
    assert api.store.get("deployments.apps", "default", "web")["spec"]["replicas"] == 2

    forced = kubectl(
        "apply",
        "--server-side",
        "--field-manager=ci",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump(deployment(5)),
    )
    assert forced.returncode == 0, forced.stderr
    stored = api.store.get("deployments.apps", "default", "web")
    assert stored["spec"]["replicas"] == 5
    owners = managers(stored)
    assert "f:replicas" in owners["ci/Apply"]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in owners["kubectl/Apply"]["fieldsV1"]["f:spec"]
    assert stored["metadata"]["labels"] == {"tier": "a"}  # still kubectl's

    again = kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(deployment(5)))
    assert again.returncode == 0, again.stderr
    assert "labels" not in api.store.get("deployments.apps", "default", "web")["metadata"]  # dropped


def test_official_client_apply_and_update_managers(api):
    apps = client.AppsV1Api(api.client)
    created = apps.create_namespaced_deployment("default", deployment(1))
    assert {e.manager for e in created.metadata.managed_fields} == {"OpenAPI-Generator"}
    assert created.metadata.managed_fields[0].operation == "Update"

    body = deployment(3)
    with pytest.raises(ApiException) as raised:
        apps.patch_namespaced_deployment("web", "default", body, field_manager="ci", _content_type=APPLY)
    status = json.loads(raised.value.body)
    assert raised.value.status == 409 and status["reason"] == "Conflict"
    assert status["details"] == {
        "causes": [
            {
                "reason": "FieldManagerConflict",
                "message": 'conflict with "OpenAPI-Generator" using apps/v1',
                "field": ".spec.replicas",
            }
        ]
    }
    same = deployment(1, image="nginx:1.27")  # the same values are shared, not conflicting
    applied = apps.patch_namespaced_deployment(
        "web", "default", same, field_manager="ci", _content_type=APPLY
    )
    assert {f"{e.manager}/{e.operation}" for e in applied.metadata.managed_fields} == {
        "OpenAPI-Generator/Update",
        "ci/Apply",
    }
    forced = apps.patch_namespaced_deployment(
        "web", "default", body, field_manager="ci", force=True, _content_type=APPLY
    )
    assert forced.spec.replicas == 3

    apps.patch_namespaced_deployment("web", "default", {"spec": {"replicas": 4}}, field_manager="hpa")
    stored = api.store.get("deployments.apps", "default", "web")
    assert "f:replicas" in managers(stored)["hpa/Update"]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in managers(stored)["ci/Apply"]["fieldsV1"]["f:spec"]  # an update takes it


def test_apply_of_an_absent_custom_resource_creates_it(api):
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpu", "labels": {"a": "1"}},
    }
    status, _, body = api.raw(
        "PATCH",
        "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/gpu?fieldManager=me",
        yaml.safe_dump(queue).encode(),
        content_type=APPLY,
    )
    assert status == 201 and body["metadata"]["managedFields"][0]["manager"] == "me"
    status, _, body = api.raw(
        "PATCH",
        "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/gpu?fieldManager=me",
        json.dumps({**queue, "metadata": {"name": "gpu", "labels": {"b": "2"}}}).encode(),
        content_type=APPLY,
    )
    assert status == 200 and body["metadata"]["labels"] == {"b": "2"}


@pytest.mark.parametrize(
    ("path", "body", "content_type", "code", "words"),
    [
        ("web", deployment(), APPLY, 422, "fieldManager: Required value: is required for apply patch"),
        (
            "web?fieldManager=x&force=true",
            {"spec": {}},
            "application/merge-patch+json",
            422,
            "non-apply patch",
        ),
        (
            "web?fieldManager=x",
            {**deployment(), "apiVersion": "apps/v1beta1"},
            APPLY,
            400,
            "Incorrect version",
        ),
        (
            "web?fieldManager=x",
            {**deployment(), "metadata": {"name": "web", "managedFields": []}},
            APPLY,
            400,
            "managedFields must be nil",
        ),
        ("web?fieldManager=x", {**deployment(), "metadata": {"name": "other"}}, APPLY, 400, "does not match"),
    ],
)
def test_bad_apply_requests_change_nothing(api, path, body, content_type, code, words):
    url = f"/apis/apps/v1/namespaces/default/deployments/{path}"
    status, _, answer = api.raw("PATCH", url, json.dumps(body).encode(), content_type=content_type)
    assert status == code and words in answer["message"], answer
    assert api.store.count("deployments.apps") == 0
