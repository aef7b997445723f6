"""Issue 15: the claim's drain and loan bookkeeping read the cluster in bounded pages, the drain only
the pods of the claimed nodes (``spec.nodeName``), never every pod of the cluster on every pass."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from tests.capacity.helpers import DEPLOYMENTS, default_seeded_objects, kube_for, nodes_by_app
from trainops.capacity import drain, inference
from trainops.capacity.procedure import claim, give_back
from trainops.kube import lists
from trainops.kube.retry import Deadline

RUN = "train_llm/manual__1"


def _lists(cluster, path_part: str) -> list[dict[str, str]]:
    """The query of every list request whose path ends with ``path_part``."""
    found = []
    for entry in cluster.server.audit.entries():
        url = urlsplit(entry["path"])
        if entry["verb"] == "list" and url.path.endswith(path_part):
            found.append({k: v[0] for k, v in parse_qs(url.query).items()})
    return found


def test_the_claim_lists_pods_by_node_and_every_list_in_pages(devcluster, monkeypatch):
    for module in (lists, drain, inference):
        monkeypatch.setattr(module, "PAGE", 1)  # so any node with two pods takes two pages
    default_seeded_objects(devcluster)
    where = nodes_by_app(devcluster)
    nodes = where["llm-chat"][:2] + where["embeddings"][:1]
    devcluster.server.audit.clear()

    claim(kube_for(devcluster), RUN, nodes, cluster_queue="training", deployments=DEPLOYMENTS)

    pod_lists = _lists(devcluster, "/api/v1/pods")
    assert pod_lists and all(q.get("limit") == "1" for q in pod_lists), pod_lists
    drain_lists = [q for q in pod_lists if q.get("fieldSelector")]
    selectors = {q["fieldSelector"] for q in drain_lists} - {"status.phase=Pending"}
    assert selectors == {f"spec.nodeName={n}" for n in nodes}, drain_lists
    # the claim's own ranking list (one, paged) is the only one without a selector; no drain pass lists everything
    first_drain = pod_lists.index(drain_lists[0])
    assert all(q.get("fieldSelector") for q in pod_lists[first_drain:]), pod_lists[first_drain:]
    on_claimed = [p for p in devcluster.store.list("pods")[0] if p["spec"].get("nodeName") in nodes]
    assert [p for p in on_claimed if drain.must_move(p)] == []

    devcluster.server.audit.clear()
    give_back(kube_for(devcluster), RUN, cluster_queue="training")

    loan_lists = _lists(devcluster, "/deployments")
    assert loan_lists and all(q.get("limit") == "1" for q in loan_lists), loan_lists


def test_a_paged_list_follows_continue_to_the_last_pod(devcluster, monkeypatch):
    monkeypatch.setattr(drain, "PAGE", 1)
    devcluster.server.audit.clear()

    pods = drain.list_pods(kube_for(devcluster).core, Deadline(30))

    stored = devcluster.store.list("pods")[0]
    assert len(stored) > 1
    assert sorted(p["metadata"]["uid"] for p in pods) == sorted(p["metadata"]["uid"] for p in stored)
    assert len(_lists(devcluster, "/api/v1/pods")) == len(stored)  # one pod per page
