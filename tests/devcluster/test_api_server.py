"""The devcluster API server against the official ``kubernetes`` client and raw HTTP.

These tests need only the store, the API server, the garbage collector and the disruption
controller, so they use a small local server (a tiny watch history makes 410 reachable).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from urllib.parse import urlsplit

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.local_api import LocalApi, node, pod


@pytest.fixture
def core(api):
    return client.CoreV1Api(api.client)


# ---- CRUD, errors, validation ----------------------------------------------------------------
def test_create_get_list_and_status_errors(api, core):
    created = core.create_namespaced_pod("default", pod("web-1", {"app": "web"}))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.status.phase == "Pending"
    assert created.spec.restart_policy == "Always"  # API defaulting

    assert core.read_namespaced_pod("web-1", "default").metadata.labels == {"app": "web"}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod("web-1"))
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "AlreadyExists"

    status, _, body = api.raw("GET", "/api/v1/namespaces/default/pods/missing")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["details"] == {"name": "missing", "kind": "pods"}
    assert body["message"] == 'pods "missing" not found'

    generated = core.create_namespaced_pod("default", {**pod(""), "metadata": {"generateName": "worker-"}})
    assert generated.metadata.name.startswith("worker-") and len(generated.metadata.name) > len("worker-")

    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("nowhere", pod("lost"))
    assert exc.value.status == 404


def test_dry_run_changes_nothing(api, core):
    before = api.store.resource_version
    out = core.create_namespaced_pod("default", pod("ghost"), dry_run="All")
    assert out.metadata.name == "ghost"
    assert api.store.find("pods", "default", "ghost") is None
    assert api.store.resource_version == before


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        ({**pod("Bad_Name")}, "metadata.name"),
        (pod("ok", {"team": "x" * 64}), "metadata.labels[team]"),
        (pod("ok", {"bad key!": "v"}), "metadata.labels"),
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {}}, "spec.containers"),
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "noimg"},
                "spec": {"containers": [{"name": "m"}]},
            },
            "spec.containers[0].image",
        ),
    ],
)
def test_invalid_objects_answer_422_with_the_field(api, manifest, field):
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", manifest)
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["details"]["kind"] == "Pod"
    assert field in [cause["field"] for cause in body["details"]["causes"]]
    assert api.store.count("pods") == 0


def test_job_needs_template_and_a_restart_policy_and_a_label_sized_name(api):
    batch = "/apis/batch/v1/namespaces/default/jobs"
    status, _, body = api.raw(
        "POST", batch, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {}}
    )
    assert status == 422 and "spec.template" in [c["field"] for c in body["details"]["causes"]]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j" * 64},
        "spec": {"template": {"spec": {"containers": [{"name": "m", "image": "x"}]}}},
    }
    status, _, body = api.raw("POST", batch, job)
    fields = [c["field"] for c in body["details"]["causes"]]
    assert status == 422 and "metadata.name" in fields and "spec.template.spec.restartPolicy" in fields


def test_kind_mismatch_and_malformed_bodies_answer_400_and_the_server_keeps_serving(api, core):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}
    status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", job)
    assert status == 400 and body["reason"] == "BadRequest"
    for garbage in (b"{not json", b"[1,2", b"\xff\xfe", b""):
        status, _, body = api.raw("POST", "/api/v1/namespaces/default/pods", garbage)
        assert status == 400 and body["kind"] == "Status"
    status, _, _ = api.raw("PATCH", "/api/v1/nodes/node-0", b"{oops", "application/merge-patch+json")
    assert status == 400
    assert [n.metadata.name for n in core.list_node().items] == ["node-0", "node-1", "node-2"]


def test_unknown_fields_are_dropped_or_rejected_when_strict(api):
    manifest = pod("typo")
    manifest["spec"]["nodeSelectr"] = {"a": "b"}
    status, headers, _ = api.raw("POST", "/api/v1/namespaces/default/pods?fieldValidation=Strict", manifest)
    assert status == 400
    status, headers, body = api.raw("POST", "/api/v1/namespaces/default/pods", manifest)
    assert status == 201 and "nodeSelectr" not in body["spec"]
    assert 'unknown field \\"spec.nodeSelectr\\"' in headers["Warning"]


# ---- list: selectors and pagination -----------------------------------------------------------
def test_label_and_field_selectors(api, core):
    for i, (tier, node_name) in enumerate([("a", "node-0"), ("b", "node-0"), ("c", "node-1"), (None, None)]):
        core.create_namespaced_pod(
            "default", pod(f"p{i}", {"tier": tier} if tier else {"other": "x"}, node_name)
        )

    def names(**kw):
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert names(label_selector="tier=a") == ["p0"]
    assert names(label_selector="tier==a") == ["p0"]
    assert names(label_selector="tier!=a") == ["p1", "p2", "p3"]
    assert names(label_selector="tier in (a,c)") == ["p0", "p2"]
    assert names(label_selector="tier notin (a,c)") == ["p1", "p3"]
    assert names(label_selector="tier") == ["p0", "p1", "p2"]
    assert names(label_selector="!tier") == ["p3"]
    assert names(label_selector="tier,other") == []
    assert names(field_selector="spec.nodeName=node-0") == ["p0", "p1"]
    assert names(field_selector="spec.nodeName!=node-0,metadata.name!=p3") == ["p2"]
    assert names(field_selector="status.phase=Pending", label_selector="tier in (b)") == ["p1"]
    all_ns = client.CoreV1Api(api.client).list_pod_for_all_namespaces(
        field_selector="metadata.namespace=default"
    )
    assert len(all_ns.items) == 4
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", field_selector="spec.color=red")
    assert exc.value.status == 400 and "field label not supported: spec.color" in exc.value.body
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", label_selector="tier in (a")
    assert exc.value.status == 400


@pytest.mark.servers
def test_pagination_returns_every_item_once_and_expires(tmp_path):
    api = LocalApi(tmp_path, history=30)
    try:
        core = client.CoreV1Api(api.client)
        for i in range(3, 25):
            api.store.create("nodes", node(f"node-{i:02d}"))
        seen, token, rvs = [], None, set()
        while True:
            page = core.list_node(limit=10, _continue=token)
            seen += [n.metadata.name for n in page.items]
            rvs.add(page.metadata.resource_version)
            token = page.metadata._continue
            if not token:
                break
        assert len(seen) == 25 and len(set(seen)) == 25
        assert len(rvs) == 1  # every page reports the list's resourceVersion
        first = core.list_node(limit=10)
        assert first.metadata.remaining_item_count == 15
        for i in range(40):  # push the list's resourceVersion out of the history
            api.store.mutate(
                "nodes", "", "node-0", lambda n, i=i: n["metadata"].setdefault("labels", {}).update(n=str(i))
            )
        with pytest.raises(ApiException) as exc:
            core.list_node(limit=10, _continue=first.metadata._continue)
        assert exc.value.status == 410
        assert json.loads(exc.value.body)["reason"] == "Expired"
    finally:
        api.close()


# ---- watch ----------------------------------------------------------------------------------
def _collect(stream, count: int) -> list[tuple[str, str]]:
    events = []
    for event in stream:
        events.append((event["type"], event["object"].metadata.name))
        if len(events) == count:
            break
    return events


def test_watch_streams_changes_and_resumes_from_a_resource_version(api, core):
    start_rv = core.list_namespaced_pod("default").metadata.resource_version
    w = watch.Watch()
    results: list = []
    reader = threading.Thread(
        target=lambda: results.extend(
            _collect(
                w.stream(core.list_namespaced_pod, "default", resource_version=start_rv, timeout_seconds=30),
                3,
            )
        )
    )
    reader.start()
    core.create_namespaced_pod("default", pod("w1"))
    core.patch_namespaced_pod("w1", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("w1", "default")
    reader.join(timeout=60)
    w.stop()
    assert results == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]

    # Resuming from the first event's resourceVersion replays what came after it.
    w2 = watch.Watch()
    replay = _collect(
        w2.stream(core.list_namespaced_pod, "default", resource_version=start_rv, timeout_seconds=5), 3
    )
    w2.stop()
    assert replay == results


@pytest.mark.servers
def test_watch_from_a_compacted_resource_version_is_410(tmp_path):
    api = LocalApi(tmp_path, history=5)
    try:
        core = client.CoreV1Api(api.client)
        old_rv = core.list_node().metadata.resource_version
        for i in range(10):
            api.store.mutate("nodes", "", "node-1", lambda n, i=i: n["metadata"]["labels"].update(v=str(i)))
        w = watch.Watch()
        with pytest.raises(ApiException) as exc:
            list(w.stream(core.list_node, resource_version=old_rv, timeout_seconds=5))
        assert exc.value.status == 410
    finally:
        api.close()


def _gold_events(core, rv: str, count: int) -> list[tuple[str, str]]:
    """The first ``count`` events of a ``tier=gold`` pod watch from ``rv``."""
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        label_selector="tier=gold",
        resource_version=rv,
        timeout_seconds=5,
    )
    try:
        return _collect(stream, count)
    finally:
        w.stop()


def test_selector_watch_sends_deleted_when_an_object_stops_matching(api, core):
    core.create_namespaced_pod("default", pod("s1", {"tier": "gold"}))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.patch_namespaced_pod("s1", "default", {"metadata": {"labels": {"tier": "silver"}}})
    core.patch_namespaced_pod("s1", "default", {"metadata": {"labels": {"tier": "gold"}}})
    assert _gold_events(core, rv, 2) == [("DELETED", "s1"), ("ADDED", "s1")]


def test_selector_watch_sends_nothing_for_an_object_that_never_matched(api, core):
    # a field-selector watch on one Job got DELETED for another Job modified after the watch began
    core.create_namespaced_pod("default", pod("s2", {"tier": "bronze"}))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.patch_namespaced_pod("s2", "default", {"metadata": {"labels": {"x": "1"}}})
    core.create_namespaced_pod("default", pod("s3", {"tier": "gold"}))
    assert _gold_events(core, rv, 1) == [("ADDED", "s3")]


def test_drop_watches_ends_open_streams(api):
    conn = http.client.HTTPConnection(urlsplit(api.url).netloc, timeout=30)
    conn.request("GET", "/api/v1/nodes?watch=1")
    response = conn.getresponse()
    first = json.loads(response.readline())
    assert first["type"] == "ADDED"
    assert api.server.drop_watches() >= 1
    rest = response.read()  # ends instead of hanging
    assert rest.count(b"\n") <= 2
    conn.close()


def test_bookmarks_and_timeout(api):
    api.server.bookmark_interval = 0.2
    status, _, body = api.raw(
        "GET",
        f"/api/v1/nodes?watch=1&allowWatchBookmarks=true&timeoutSeconds=1"
        f"&resourceVersion={api.store.resource_version}",
    )
    assert status == 200
    events = [json.loads(line) for line in body.splitlines()] if isinstance(body, str) else [body]
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(api.store.resource_version)


# ---- patch ----------------------------------------------------------------------------------
def test_merge_json_and_strategic_patches(api, core):
    core.patch_node("node-0", {"spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]}})
    # strategic merge patch: taints are atomic, replaced whole
    core.patch_node("node-0", {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})
    assert [t.key for t in core.read_node("node-0").spec.taints] == ["b"]
    # JSON patch with a passing test
    rv = core.read_node("node-0").metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "c", "effect": "NoExecute"}},
    ]
    core.patch_node("node-0", ops)
    assert [t.key for t in core.read_node("node-0").spec.taints] == ["b", "c"]
    # a failed test changes nothing and answers 422, as a real server does
    status, _, body = api.raw("PATCH", "/api/v1/nodes/node-0", ops, "application/json-patch+json")
    assert status == 422 and body["reason"] == "Invalid"
    assert [t.key for t in core.read_node("node-0").spec.taints] == ["b", "c"]
    # merge patch: maps merge, null deletes
    status, _, body = api.raw(
        "PATCH",
        "/api/v1/nodes/node-0",
        {"metadata": {"labels": {"rack": None, "new": "1"}}},
        "application/merge-patch+json",
    )
    assert status == 200 and body["metadata"]["labels"] == {"kubernetes.io/hostname": "node-0", "new": "1"}


def test_strategic_patch_merges_containers_by_name(api):
    apps = client.AppsV1Api(api.client)
    apps.create_namespaced_deployment("default", deployment("web", 1))
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "envoy:1"},
                        {"name": "web", "image": "nginx:2"},
                    ]
                }
            }
        }
    }
    status, _, body = api.raw(
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/web",
        patch,
        "application/strategic-merge-patch+json",
    )
    assert status == 200
    containers = {c["name"]: c for c in body["spec"]["template"]["spec"]["containers"]}
    assert containers["web"]["image"] == "nginx:2" and containers["web"]["ports"] == [
        {"containerPort": 80, "protocol": "TCP"}
    ]
    assert containers["sidecar"]["image"] == "envoy:1"
    delete = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}
    _, _, body = api.raw(
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/web",
        delete,
        "application/strategic-merge-patch+json",
    )
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["web"]


def test_strategic_patch_on_a_custom_resource_is_415(api):
    custom = client.CustomObjectsApi(api.client)
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "wl"},
        "spec": {"queueName": "q", "podSets": []},
    }
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads", workload)
    path = "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads/wl"
    status, _, body = api.raw(
        "PATCH", path, {"spec": {"active": False}}, "application/strategic-merge-patch+json"
    )
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    status, _, body = api.raw("PATCH", path, {"spec": {"active": False}}, "application/merge-patch+json")
    assert status == 200 and body["spec"]["active"] is False


def test_resource_version_in_a_patch_is_a_precondition(api, core):
    stale = core.read_node("node-1").metadata.resource_version
    core.patch_node("node-1", {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as exc:
        core.patch_node("node-1", {"metadata": {"resourceVersion": stale, "labels": {"late": "yes"}}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"
    assert "late" not in core.read_node("node-1").metadata.labels


def test_put_with_a_stale_resource_version_conflicts(api, core):
    fresh = core.read_node("node-2")
    core.patch_node("node-2", {"metadata": {"labels": {"x": "1"}}})
    fresh.metadata.labels["y"] = "2"
    with pytest.raises(ApiException) as exc:
        core.replace_node("node-2", fresh)
    assert exc.value.status == 409


def test_racing_taint_writers_lose_nothing(api, core):
    """Two writers read the same node, each adds its taint with an RV-guarded merge patch; one gets 409,
    re-reads and retries; both taints end up on the node."""
    barrier = threading.Barrier(2)
    conflicts = []

    def add_taint(key: str) -> None:
        writer = client.CoreV1Api(config.new_client_from_config(config_file=str(api.kubeconfig)))
        first = True
        while True:
            current = writer.read_node("node-0")
            taints = [t.to_dict() for t in current.spec.taints or []]
            taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
            if first:
                barrier.wait()
                first = False
            body = {
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "spec": {"taints": taints + [{"key": key, "value": "x", "effect": "NoSchedule"}]},
            }
            try:
                writer.patch_node("node-0", body, _content_type="application/merge-patch+json")
                return
            except ApiException as exc:
                assert exc.status == 409
                conflicts.append(key)

    threads = [threading.Thread(target=add_taint, args=(k,)) for k in ("writer-a", "writer-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(conflicts) >= 1
    assert sorted(t.key for t in core.read_node("node-0").spec.taints) == ["writer-a", "writer-b"]


# ---- subresources ---------------------------------------------------------------------------
def deployment(name: str, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": name, "image": "nginx:1", "ports": [{"containerPort": 80}]}]
                },
            },
        },
    }


def test_status_subresource_semantics(api, core):
    core.create_namespaced_pod("default", pod("st"))
    # the main resource ignores .status
    core.patch_namespaced_pod(
        "st", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"a": "b"}}}
    )
    after = core.read_namespaced_pod("st", "default")
    assert after.status.phase == "Pending" and after.metadata.labels == {"a": "b"}
    # /status changes only .status
    core.patch_namespaced_pod_status(
        "st", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"c": "d"}}}
    )
    after = core.read_namespaced_pod("st", "default")
    assert after.status.phase == "Running" and after.metadata.labels == {"a": "b"}


def test_scale_subresource(api):
    apps = client.AppsV1Api(api.client)
    apps.create_namespaced_deployment("default", deployment("web", 2))
    scale = apps.read_namespaced_deployment_scale("web", "default")
    assert scale.spec.replicas == 2 and scale.status.selector == "app=web"
    apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 5}})
    assert apps.read_namespaced_deployment("web", "default").spec.replicas == 5
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": -1}})
    assert exc.value.status == 422


def test_pod_logs(api, core):
    core.create_namespaced_pod("default", pod("talker"))
    api.store.mutate("pods", "default", "talker", lambda p: p["status"].update(phase="Running"))
    api.logs.append("default", "talker", "line 1\nline 2\nline 3\n")
    # (kubernetes 36 turns a non-JSON body into "b'...'"; read the raw response as its users do)
    raw = core.read_namespaced_pod_log("talker", "default", _preload_content=False)
    assert raw.data.decode() == "line 1\nline 2\nline 3\n"
    tail = core.read_namespaced_pod_log("talker", "default", tail_lines=1, _preload_content=False)
    assert tail.data.decode() == "line 3\n"


# ---- eviction and deletion ------------------------------------------------------------------
def _ready_pod(api, name: str, node_name: str, labels: dict) -> None:
    api.store.create(
        "pods",
        {
            **pod(name, labels, node_name),
            "metadata": {"name": name, "namespace": "default", "labels": labels},
        },
    )
    api.store.mutate(
        "pods",
        "default",
        name,
        lambda p: p.setdefault("status", {}).update(
            phase="Running", conditions=[{"type": "Ready", "status": "True"}]
        ),
    )


def _pdb(name: str, selector: dict, min_available: int) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
    }


def test_eviction_honours_pod_disruption_budgets(api, core):
    policy = client.PolicyV1Api(api.client)
    for i in range(2):
        _ready_pod(api, f"db-{i}", f"node-{i}", {"app": "db"})
    policy.create_namespaced_pod_disruption_budget("default", _pdb("db", {"app": "db"}, 1))
    wait_for(
        lambda: (
            (api.store.get("poddisruptionbudgets.policy", "default", "db").get("status") or {}).get(
                "disruptionsAllowed"
            )
            == 1
        ),
        "the disruption controller computed the budget",
    )

    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "db-0", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0},
    }
    core.create_namespaced_pod_eviction("db-0", "default", eviction)
    assert api.store.find("pods", "default", "db-0") is None

    status, _, body = api.raw(
        "POST",
        "/api/v1/namespaces/default/pods/db-1/eviction",
        {**eviction, "metadata": {"name": "db-1", "namespace": "default"}},
    )
    assert status == 429 and body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert api.store.find("pods", "default", "db-1") is not None

    policy.create_namespaced_pod_disruption_budget("default", _pdb("db-too", {"app": "db"}, 0))
    status, _, body = api.raw(
        "POST",
        "/api/v1/namespaces/default/pods/db-1/eviction",
        {**eviction, "metadata": {"name": "db-1", "namespace": "default"}},
    )
    assert status == 500 and "more than one PodDisruptionBudget" in body["message"]


def test_deleting_a_running_pod_is_graceful_and_a_pending_one_immediate(api, core):
    core.create_namespaced_pod("default", pod("pending"))
    core.delete_namespaced_pod("pending", "default")
    assert api.store.find("pods", "default", "pending") is None
    _ready_pod(api, "running", "node-0", {})
    core.delete_namespaced_pod("running", "default", grace_period_seconds=30)
    left = api.store.get("pods", "default", "running")
    assert left["metadata"]["deletionTimestamp"] and left["metadata"]["deletionGracePeriodSeconds"] == 30
    core.delete_namespaced_pod("running", "default", grace_period_seconds=0)
    assert api.store.find("pods", "default", "running") is None


def test_delete_preconditions(api, core):
    core.create_namespaced_pod("default", pod("pre"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod(
            "pre",
            "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1")),
        )
    assert exc.value.status == 409
    assert api.store.find("pods", "default", "pre") is not None


def _owned_pod(name: str, owner: dict) -> dict:
    ref = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {**pod(name), "metadata": {"name": name, "namespace": "default", "ownerReferences": [ref]}}


@pytest.mark.parametrize("policy", ["Background", "Foreground", "Orphan"])
def test_delete_propagation(api, policy):
    apps = client.AppsV1Api(api.client)
    owner = apps.create_namespaced_deployment("default", deployment("owner", 1)).to_dict()
    owner = {"metadata": {"name": "owner", "uid": owner["metadata"]["uid"]}}
    for i in range(2):
        api.store.create("pods", _owned_pod(f"child-{i}", owner))
    apps.delete_namespaced_deployment("owner", "default", propagation_policy=policy)
    wait_for(lambda: api.store.find("deployments.apps", "default", "owner") is None, "the owner is gone")
    children = [api.store.find("pods", "default", f"child-{i}") for i in range(2)]
    if policy == "Orphan":
        assert all(c is not None and not c["metadata"].get("ownerReferences") for c in children)
    else:
        wait_for(lambda: api.store.count("pods") == 0, "the dependents are gone")


# ---- faults and audit -----------------------------------------------------------------------
def test_injected_faults_and_the_audit_log(api):
    api.server.faults.add(r"^/api/v1/nodes", 503, count=2)
    assert [api.raw("GET", "/api/v1/nodes")[0] for _ in range(3)] == [503, 503, 200]
    api.server.faults.add(r"/api/v1/nodes/node-1", 429, count=1)
    status, headers, body = api.raw("GET", "/api/v1/nodes/node-1")
    assert status == 429 and headers["Retry-After"] == "1" and body["reason"] == "TooManyRequests"
    api.server.faults.add(r"^/api/v1/namespaces", 500, fraction=1.0)
    assert api.raw("GET", "/api/v1/namespaces")[0] == 500
    api.server.faults.clear()
    assert api.raw("GET", "/api/v1/namespaces")[0] == 200

    api.server.audit.clear()
    api.raw("GET", "/api/v1/nodes?labelSelector=rack%3Dr0")
    api.raw("GET", "/api/v1/nodes/node-0")
    api.raw(
        "PATCH", "/api/v1/nodes/node-0", {"metadata": {"labels": {"z": "1"}}}, "application/merge-patch+json"
    )
    api.raw("POST", "/api/v1/namespaces/default/pods", pod("audited"))
    api.raw("DELETE", "/api/v1/namespaces/default/pods/audited")
    entries = api.server.audit.entries()
    assert [(e["verb"], e["status"]) for e in entries] == [
        ("list", 200),
        ("get", 200),
        ("patch", 200),
        ("create", 201),
        ("delete", 200),
    ]
    assert entries[0]["path"] == "/api/v1/nodes?labelSelector=rack%3Dr0"
    assert entries[0]["method"] == "GET" and "user_agent" in entries[0]


def test_faults_reject_bad_arguments(api):
    with pytest.raises(ValueError, match="status"):
        api.server.faults.add("x", 404, count=1)
    with pytest.raises(ValueError, match="exactly one"):
        api.server.faults.add("x", 500)


# ---- discovery and OpenAPI ------------------------------------------------------------------
def test_discovery_and_openapi(api):
    status, _, body = api.raw("GET", "/api/v1")
    pods = next(r for r in body["resources"] if r["name"] == "pods")
    eviction = next(r for r in body["resources"] if r["name"] == "pods/eviction")
    assert pods["shortNames"] == ["po"] and "watch" in pods["verbs"]
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1", "Eviction")
    _, _, groups = api.raw("GET", "/apis")
    assert {g["name"] for g in groups["groups"]} >= {"apps", "batch", "policy", "kueue.x-k8s.io"}
    _, _, kueue = api.raw("GET", "/apis/kueue.x-k8s.io/v1beta2")
    assert {r["name"]: r["namespaced"] for r in kueue["resources"] if "/" not in r["name"]} == {
        "resourceflavors": False,
        "clusterqueues": False,
        "localqueues": True,
        "workloads": True,
        "workloadpriorityclasses": False,
        "topologies": False,
    }
    _, _, root = api.raw("GET", "/openapi/v3")
    assert "apis/batch/v1" in root["paths"]
    _, _, doc = api.raw("GET", root["paths"]["apis/batch/v1"]["serverRelativeURL"])
    assert doc["components"]["schemas"]["io.k8s.api.batch.v1.Job"]["x-kubernetes-group-version-kind"]
    assert api.raw("GET", "/version")[2]["gitVersion"].startswith("v1.")


def test_a_request_whose_client_closed_the_connection_is_cancelled_not_applied(api, core):
    """kube-apiserver cancels a request whose connection closes before it is served (504 ``context
    canceled`` in its log) and applies nothing: what a client sees that sends a request on a
    connection whose previous response it released unread, fails at once and closes it."""
    core.create_namespaced_pod("default", pod("keep", node_name="node-0"))
    api.server.cancel_window_s = (
        0.5  # the devcluster's writes take microseconds, kube-apiserver's milliseconds
    )
    request = (
        "DELETE /api/v1/namespaces/default/pods/keep HTTP/1.1\r\n"
        "Host: devcluster\r\nContent-Length: 0\r\n\r\n"
    )
    address = urlsplit(api.url)
    with socket.create_connection((address.hostname, address.port)) as conn:
        conn.sendall(request.encode())
        conn.shutdown(socket.SHUT_WR)  # sent, and gone before an answer
        assert conn.recv(1) == b""  # no answer

    wait_for(lambda: any(e["path"].endswith("/pods/keep") for e in api.server.audit.entries()), "audited")
    assert [e["status"] for e in api.server.audit.entries() if e["path"].endswith("/pods/keep")] == [504]
    assert api.store.find("pods", "default", "keep") is not None


@pytest.mark.servers
@pytest.mark.parametrize(("served", "other"), [("v1beta1", "v1beta2"), ("v1beta2", "v1beta1")])
def test_kueue_is_served_at_one_version_which_trainops_discovers_once_per_client(tmp_path, served, other):
    from trainops.kube.client import Kube

    api = LocalApi(tmp_path, kueue_version=served)
    try:
        _, _, group = api.raw("GET", "/apis/kueue.x-k8s.io")
        assert group["preferredVersion"]["version"] == served
        # Kueue 0.13 serves its Topology at v1alpha1 beside v1beta1; 0.15+ serves it at v1beta2
        assert [v["version"] for v in group["versions"]] == [served] + (
            ["v1alpha1"] if served == "v1beta1" else []
        )
        assert api.raw("GET", f"/apis/kueue.x-k8s.io/{other}")[0] == 404
        assert api.raw("GET", f"/apis/kueue.x-k8s.io/{other}/clusterqueues")[0] == 404
        assert f"apis/kueue.x-k8s.io/{served}" in api.raw("GET", "/openapi/v3")[2]["paths"]

        kube = Kube(api.client)
        flavor = {
            "apiVersion": f"kueue.x-k8s.io/{served}",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"},
        }
        kube.create(flavor, kube.kueue("resourceflavors", namespaced=False))
        listed = kube.list(kube.kueue("resourceflavors", namespaced=False))
        assert [f["apiVersion"] for f in listed] == [f"kueue.x-k8s.io/{served}"]
        asked = [e for e in api.server.audit.entries() if e["path"] == "/apis/kueue.x-k8s.io"]
        assert len(asked) == 2  # the raw GET above, then trainops once for this client
    finally:
        api.close()
