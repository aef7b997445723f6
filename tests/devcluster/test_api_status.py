"""Request handling as kube-apiserver does it: kind/apiVersion from the URL, and Status bodies of
the real shape (apimachinery ``errors.go``) for every error code a client can meet."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from trainops_devcluster.pod_admission import pod_admission

from tests.devcluster.local_api import pod


def failure(reason: str, code: int, message: str, details: dict | None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }
    if details is None:
        del body["details"]
    return body


def test_typed_bodies_without_kind_or_api_version_are_defaulted_from_the_url(api):
    core = client.CoreV1Api(api.client)
    created = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="e2e-typed")))
    assert created.kind == "Namespace" and created.api_version == "v1"
    assert api.store.get("namespaces", "", "e2e-typed")["metadata"]["name"] == "e2e-typed"
    status, _, body = api.raw("POST", "/apis/batch/v1/namespaces/default/jobs", {"metadata": {"name": "j"}})
    assert status == 422 and body["details"]["kind"] == "Job"  # decoded as a Job, then validated
    status, _, body = api.raw(
        "POST", "/api/v1/namespaces", {"apiVersion": "apps/v1", "metadata": {"name": "x"}}
    )
    assert status == 400 and "does not match the expected API version (v1)" in body["message"]


def test_not_found_names_the_missing_object(api):
    status, _, body = api.raw("GET", "/apis/batch/v1/namespaces/default/jobs/gone")
    assert (status, body) == (
        404,
        failure(
            "NotFound", 404, 'jobs.batch "gone" not found', {"name": "gone", "group": "batch", "kind": "jobs"}
        ),
    )
    status, _, body = api.raw("GET", "/api/v1/namespaces/default/nosuchthings")
    assert (status, body) == (
        404,
        failure("NotFound", 404, "the server could not find the requested resource", {}),
    )
    status, _, body = api.raw("POST", "/api/v1/namespaces/nowhere/pods", pod("p"))
    assert body == failure(
        "NotFound", 404, 'namespaces "nowhere" not found', {"name": "nowhere", "kind": "namespaces"}
    )
    assert api.store.count("pods") == 0


def test_already_exists_and_conflict(api):
    api.raw("POST", "/api/v1/namespaces/default/pods", pod("p"))
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", pod("p"))
    assert body == failure("AlreadyExists", 409, 'pods "p" already exists', {"name": "p", "kind": "pods"})
    stale = {**pod("p"), "metadata": {"name": "p", "resourceVersion": "1"}}
    status, _, body = api.raw("PUT", "/api/v1/namespaces/default/pods/p", stale)
    assert status == 409 and body["reason"] == "Conflict"
    assert body["details"] == {"name": "p", "kind": "pods"}
    assert body["message"].startswith(
        'Operation cannot be fulfilled on pods "p": the object has been modified'
    )


def test_bad_request_forbidden_and_unsupported_media_type(api):
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", b"{not json")
    assert status == 400 and body["reason"] == "BadRequest" and "details" not in body
    held = {**pod("held"), "metadata": {"name": "held", "finalizers": ["test/hold"]}}
    assert api.raw("POST", "/api/v1/namespaces/team/pods", held)[0] == 201
    assert api.raw("DELETE", "/api/v1/namespaces/team")[0] == 200  # terminating while the pod is held
    status, _, body = api.raw("POST", "/api/v1/namespaces/team/pods", pod("late"))
    assert status == 403 and body["reason"] == "Forbidden"
    assert body["details"] == {"name": "late", "kind": "pods"}
    assert "because it is being terminated" in body["message"]
    status, _, body = api.raw(
        "PATCH", "/api/v1/namespaces/default/pods/absent", b"{}", content_type="application/x-unknown"
    )
    assert status == 415 and body["reason"] == "UnsupportedMediaType" and body["code"] == 415


def test_invalid_lists_the_causes_under_the_kind(api):
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", pod("Bad_Name"))
    assert status == 422 and body["reason"] == "Invalid"
    assert body["details"]["name"] == "Bad_Name" and body["details"]["kind"] == "Pod"
    assert body["details"]["causes"][0]["field"] == "metadata.name"


NEITHER = "name is neither a standard finalizer name nor is it fully qualified"


@pytest.mark.parametrize(
    ("finalizers", "causes"),
    [
        (["kubernetes", "orphan", "foregroundDeletion", "example.com/x"], None),
        (["mine"], [("metadata.finalizers[0]", f'Invalid value: "mine": {NEITHER}')]),
        (["bad_prefix/x"], [("metadata.finalizers", 'Invalid value: "bad_prefix/x": prefix part ')]),
        (
            ["-bad"],
            [
                ("metadata.finalizers", 'Invalid value: "-bad": name part must consist of alphanumeric'),
                ("metadata.finalizers[0]", f'Invalid value: "-bad": {NEITHER}'),
            ],
        ),
    ],
)
def test_finalizer_names_are_validated_as_kube_apiserver_does(api, finalizers, causes):
    """As kube-apiserver 1.36 answered: a built-in kind takes a standard finalizer or one with a
    domain prefix; an unqualified one is refused before admission (a policy never sees it)."""
    cm = {"metadata": {"name": "f", "finalizers": finalizers}}
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/configmaps?dryRun=All", cm)
    if causes is None:
        assert status == 201 and body["metadata"]["finalizers"] == finalizers
        return
    assert (status, body["reason"]) == (422, "Invalid")
    got = [(c["field"], c["message"]) for c in body["details"]["causes"]]
    assert [f for f, _ in got] == [f for f, _ in causes]
    assert all(m.startswith(want) for (_, m), (_, want) in zip(got, causes, strict=True))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"runtimeClassName": "absent"},
            'pods "gen-" is forbidden: pod rejected: RuntimeClass "absent" not found',
        ),
        (
            {"priorityClassName": "nope"},
            'pods "gen-" is forbidden: no PriorityClass with name nope was found',
        ),
    ],
)
def test_a_pod_refused_by_mutating_admission_is_named_by_its_generate_name(api, monkeypatch, spec, message):
    """As kube-apiserver 1.36 answered: the RuntimeClass and Priority plugins run before the name is
    generated, so their refusal names the ``generateName`` (Pod Security, later, names the pod)."""
    monkeypatch.setattr(api.server, "admission", [pod_admission(api.store)])  # as a DevCluster wires it
    body = pod("x")
    body["metadata"] = {"generateName": "gen-"}
    body["spec"].update(spec)
    status, _, answer = api.raw("POST", "/api/v1/namespaces/default/pods", body)
    assert (status, answer["message"], answer["details"]) == (403, message, {"name": "gen-", "kind": "pods"})


def test_expired_too_many_requests_and_internal_error(api):
    for i in range(250):  # beyond the 200 events of history the LocalApi keeps
        api.store.create("pods", {**pod(f"w{i}"), "metadata": {"name": f"w{i}", "namespace": "default"}})
    status, _, body = api.raw("GET", "/api/v1/namespaces/default/pods?limit=1&continue=" + _token(1))
    assert status == 410 and body["reason"] == "Expired" and "details" not in body

    api.server.faults.add("^/api/v1/nodes$", 429, count=1)
    status, headers, body = api.raw("GET", "/api/v1/nodes")
    assert status == 429 and headers["Retry-After"] == "1"
    assert body["reason"] == "TooManyRequests" and body["details"] == {"retryAfterSeconds": 1}

    api.server.faults.add("^/api/v1/nodes$", 500, count=1)
    status, _, body = api.raw("GET", "/api/v1/nodes")
    assert status == 500 and body["reason"] == "InternalError"
    assert body["details"] == {"causes": [{"message": "injected fault for /api/v1/nodes"}]}
    with pytest.raises(ApiException) as raised:
        api.server.faults.add("^/api/v1/nodes$", 500, count=1)
        client.CoreV1Api(api.client).list_node(_preload_content=False)
    assert raised.value.status == 500
    assert (
        json.loads(raised.value.body)["message"]
        == "Internal error occurred: injected fault for /api/v1/nodes"
    )


def _token(rv: int) -> str:
    import base64

    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": ["default", "a"]}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def test_fresh_status_has_the_counters_typed_clients_require(api):
    template = {
        "metadata": {"labels": {"app": "d"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }
    spec = {"selector": {"matchLabels": {"app": "d"}}, "template": template}
    body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}, "spec": spec}
    created = client.AppsV1Api(api.client).create_namespaced_daemon_set(
        "default", body
    )  # typed: counters required
    assert (created.status.current_number_scheduled, created.status.number_ready) == (0, 0)
    budget = {
        "metadata": {"name": "b"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "d"}}},
    }
    assert (
        client.PolicyV1Api(api.client)
        .create_namespaced_pod_disruption_budget("default", budget)
        .status.expected_pods
        == 0
    )
    assert (
        client.CoreV1Api(api.client).create_namespaced_config_map("default", {"metadata": {"name": "c"}}).data
        is None
    )
