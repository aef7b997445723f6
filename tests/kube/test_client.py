"""``Kube``'s verbs against the devcluster: get-or-none, paged lists, create/patch/delete that say what
happened, the guarded edit under a rival writer, and the resumable watch; ``KubeSettings`` from options."""

from __future__ import annotations

import threading
import time

import pytest

from trainops.kube.client import CONFIGMAPS, JOBS, NODES, Kube
from trainops.kube.settings import KubeSettings


@pytest.fixture
def kube(make_devcluster):
    cluster = make_devcluster(nodes=4)
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig), settings=KubeSettings(page_size=2))
    kube.cluster = cluster
    return kube


def configmap(name: str, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
    }


def test_reads_and_writes_say_what_happened(kube):
    assert kube.get(JOBS, "nope", "training") is None
    assert kube.patch(CONFIGMAPS, "nope", {"data": {"a": "1"}}, "default") is None
    assert kube.delete(CONFIGMAPS, "nope", "default") is False

    made, created = kube.create(configmap("one", a="1"), CONFIGMAPS)
    again, created_again = kube.create(configmap("one", a="2"), CONFIGMAPS)
    assert (created, created_again) == (True, False)
    assert again["metadata"]["uid"] == made["metadata"]["uid"] and again["data"] == {"a": "1"}

    patched = kube.patch(CONFIGMAPS, "one", {"data": {"b": "2"}}, "default")
    assert patched["data"] == {"a": "1", "b": "2"}
    assert kube.delete(CONFIGMAPS, "one", "default") is True
    assert kube.get(CONFIGMAPS, "one", "default") is None


def test_a_list_follows_every_page_through_transient_answers(kube):
    kube.cluster.inject("api-fault", path=r"^/api/v1/nodes\?", status=503, count=2)
    names = sorted(n["metadata"]["name"] for n in kube.list(NODES))  # 2 per page
    assert len(names) >= 4 and names == sorted(kube.get_all(NODES, names))
    pages = [e for e in kube.cluster.server.audit.entries() if e["path"].startswith("/api/v1/nodes?")]
    assert sum(e["status"] == 200 for e in pages) == (len(names) + 1) // 2
    assert sum(e["status"] == 503 for e in pages) == 2


def test_a_guarded_edit_rereads_and_reapplies_when_a_rival_wrote_first(kube):
    kube.create(configmap("counter", n="0"), CONFIGMAPS)
    stale = kube.get(CONFIGMAPS, "counter", "default")
    kube.patch(CONFIGMAPS, "counter", {"data": {"n": "5"}}, "default")  # the rival, after our read

    def increment(obj: dict) -> dict:
        return {"data": {"n": str(int(obj["data"]["n"]) + 1)}}

    edited = kube.edit(CONFIGMAPS, "counter", increment, "default", current=stale)

    assert edited.wrote and edited.object["data"]["n"] == "6"  # 5 + 1: not lost, not 0 + 1
    conflicts = [e for e in kube.cluster.server.audit.entries() if e["status"] == 409]
    assert len(conflicts) == 1


def test_a_watch_of_named_objects_sees_changes_across_dropped_connections(kube):
    names = sorted(n["metadata"]["name"] for n in kube.list(NODES))[:2]
    seen: list[dict] = []

    def label(value: str) -> None:
        time.sleep(0.3)
        kube.cluster.inject("drop-watches")
        time.sleep(0.3)
        kube.patch(NODES, names[1], {"metadata": {"labels": {"watched": value}}})

    writer = threading.Thread(target=label, args=("yes",))
    writer.start()
    for snapshot in kube.watch(NODES, names=set(names), until=time.monotonic() + 30):
        seen.append(snapshot)
        if (snapshot[names[1]]["metadata"].get("labels") or {}).get("watched") == "yes":
            break
    writer.join()

    assert set(seen[0]) == set(names)
    assert seen[-1][names[1]]["metadata"]["labels"]["watched"] == "yes"


@pytest.mark.parametrize(
    "sources, message",
    [
        (
            [("[trainops]", {"api_deadline_s": "soon"})],
            "[trainops]: api_deadline_s must be a number of seconds",
        ),
        ([("[trainops]", {"page_size": "0"})], "[trainops]: page_size must be a positive integer"),
        (
            [("[trainops]", {"api_deadline_s": "30"}), ("connection k8s", {"api_deadline_s": "-1"})],
            "connection k8s: api_deadline_s must be positive seconds",
        ),
    ],
)
def test_settings_refuse_a_bad_value_naming_the_key_and_where_it_was_set(sources, message):
    with pytest.raises(ValueError) as refused:
        KubeSettings.from_options(*sources)
    assert str(refused.value).startswith(message)


def test_settings_take_the_connection_over_the_config_and_keep_the_documented_defaults():
    settings = KubeSettings.from_options(
        ("[trainops]", {"api_deadline_s": "30", "watch_timeout_s": "20", "kubernetes_conn_id": "k"}),
        ("connection k8s", {"api_deadline_s": "45"}),
    )
    assert (settings.api_deadline_s, settings.watch_timeout_s, settings.page_size) == (45.0, 20, 500)


def test_is_denied_is_401_or_403_only():
    """The status-code rule for a refused caller lives here, not in its callers."""
    from kubernetes.client.exceptions import ApiException

    from trainops.kube.client import is_denied

    assert is_denied(ApiException(status=403)) and is_denied(ApiException(status=401))
    assert not any(is_denied(ApiException(status=s)) for s in (404, 409, 429, 500))
    assert not is_denied(ConnectionError())
