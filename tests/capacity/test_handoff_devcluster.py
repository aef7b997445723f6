"""A hand-off that holds with servers that behave like vLLM's default (the demo inference server:
Ready before its model loads unless probed, in-flight requests aborted on SIGTERM): a claim drains
a workload that lacks a readinessProbe and a preStop hook the safe way under a steady load with no
failed request, or, with ``unsafe_inference="refuse"``, refuses before anything changes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from trainops_devcluster.demo.load import Load
from trainops_devcluster.topology import InferenceWorkload

from tests.capacity.helpers import default_seeded_objects, kube_for, nodes_by_app, snapshot
from trainops.capacity.handoff import DETACHED_ANNOTATION, UnsafeHandoff
from trainops.capacity.procedure import claim, give_back

RUN = "train_llm/manual__7"
CHAT = "inference/chat"


def bare_chat(replicas: int = 6, min_available: int = 4) -> InferenceWorkload:
    """Demo inference servers with none of a clean hand-off: no probe, no preStop, no --shutdown-timeout."""
    return InferenceWorkload(
        "chat",
        replicas,
        min_available=min_available,
        server=True,
        server_args=("--service-ms", "50"),
        handoff=False,
    )


PROXY_LAG_S = 1.0  # kube-proxy keeps sending connections to a withdrawn endpoint this long


def start(make_devcluster, workload: InferenceWorkload, proxy_lag_s: float = PROXY_LAG_S):
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    cluster = make_devcluster(nodes=8, inference=[workload], process_env=env)
    cluster._controllers.proxy.lag_s = proxy_lag_s
    default_seeded_objects(cluster)
    return cluster


def test_a_workload_without_prestop_or_probe_is_drained_the_safe_way_and_no_request_fails(
    make_devcluster, caplog
):
    """6 servers without probe or preStop (PDB minAvailable 4), a steady load through their Service:
    a claim of 2 of their nodes takes those pods out of the Service first, waits until no
    EndpointSlice lists them, and only then scales the Deployment down; every request is served."""
    cluster = start(make_devcluster, bare_chat())
    time.sleep(2)  # the servers loaded their models (without a probe they were Ready before)
    load = Load(cluster.service_address("inference", "chat", 80), rate=30).start()
    try:
        time.sleep(1)
        load.phase("claim")
        nodes = nodes_by_app(cluster)["chat"][:2]
        with caplog.at_level("INFO"):
            summary = claim(
                kube_for(cluster),
                RUN,
                nodes,
                cluster_queue="training",
                deployments=[CHAT],
                endpoint_propagation_s=1.5,  # above the proxy's lag
            )
        load.phase("after")
        time.sleep(1)
    finally:
        load.stop()

    assert summary.workloads_shrunk == [f"Deployment {CHAT}"] and summary.evictions == 0
    assert cluster.store.find("deployments.apps", "inference", "chat")["spec"]["replicas"] == 4
    text = caplog.text
    assert "lacks a clean hand-off" in text and "readinessProbe" in text and "lifecycle.preStop" in text
    assert text.count("out of its Service(s) (labels app removed) before it gets SIGTERM") == 2
    rows = {row.phase: row for row in load.report()}
    assert all(row.served > 0 and row.failed == 0 for row in rows.values()), [r.line() for r in rows.values()]
    give_back(kube_for(cluster), RUN, cluster_queue="training")


def test_the_safe_drain_keeps_the_budget_when_pods_move_by_eviction(make_devcluster):
    """With the budget binding (minAvailable 5 of 6), the claim keeps the replicas and moves the 2 pods
    by eviction: each is asked of the Eviction API first as a dry run, taken out of its Service, and
    evicted once no EndpointSlice lists it; the budget's healthy pods never drop below 5."""
    cluster = start(make_devcluster, bare_chat(min_available=5))
    nodes = nodes_by_app(cluster)["chat"][:2]
    lowest = [6]
    done = False

    def sample() -> None:
        while not done:
            pods = [
                p
                for p in cluster.store.list("pods", "inference")[0]
                if (p["metadata"].get("labels") or {}).get("app") == "chat"
                and not p["metadata"].get("deletionTimestamp")
                and any(
                    c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])
                )
            ]
            lowest[0] = min(lowest[0], len(pods))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        summary = claim(
            kube_for(cluster),
            RUN,
            nodes,
            cluster_queue="training",
            deployments=[CHAT],
            endpoint_propagation_s=0.5,
        )
    finally:
        done = True
        sampler.join()
    assert summary.evictions == 2 and summary.workloads_shrunk == []
    assert lowest[0] >= 5, lowest
    evicted = [
        p
        for p in cluster.store.list("pods", "inference")[0]
        if DETACHED_ANNOTATION in (p["metadata"].get("annotations") or {})
    ]
    assert not [p for p in evicted if p["spec"].get("nodeName") not in nodes]
    give_back(kube_for(cluster), RUN, cluster_queue="training")


def test_refuse_refuses_before_anything_changes_naming_the_field_and_fix(make_devcluster):
    cluster = start(make_devcluster, bare_chat())
    before = snapshot(cluster)
    nodes = nodes_by_app(cluster)["chat"][:2]
    with pytest.raises(UnsafeHandoff) as refused:
        claim(
            kube_for(cluster),
            RUN,
            nodes,
            cluster_queue="training",
            deployments=[CHAT],
            unsafe_inference="refuse",
        )
    message = str(refused.value)
    assert "Deployment inference/chat: spec.template.spec.containers[0].readinessProbe" in message
    assert "spec.template.spec.containers[0].lifecycle.preStop" in message
    assert "preStop: {sleep: {seconds: N}}" in message and "nothing was changed" in message
    assert snapshot(cluster) == before


def test_a_workload_set_up_for_a_clean_handoff_is_not_detached(make_devcluster, caplog):
    """The default demo workload (probe on /health, preStop sleep, --shutdown-timeout, grace above
    both) passes the check: its pods are scaled away as they are, the preStop keeps them serving."""
    chat = InferenceWorkload("chat", 6, min_available=4, server=True, server_args=("--service-ms", "50"))
    cluster = start(make_devcluster, chat)
    load = Load(cluster.service_address("inference", "chat", 80), rate=30).start()
    try:
        time.sleep(1)
        nodes = nodes_by_app(cluster)["chat"][:2]
        with caplog.at_level("INFO"):
            claim(
                kube_for(cluster),
                RUN,
                nodes,
                cluster_queue="training",
                deployments=[CHAT],
                unsafe_inference="refuse",
            )
        time.sleep(1)
    finally:
        load.stop()
    assert "out of its Service" not in caplog.text
    assert all(row.failed == 0 for row in load.report()), [r.line() for r in load.report()]


@pytest.mark.servers
def test_the_demo_server_is_not_forgiving(tmp_path):
    """Like vLLM by default: /health answers 503 while the model loads, and SIGTERM aborts a request
    in flight; with --shutdown-timeout the request in flight is answered."""
    import socket

    def run(*args: str):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "trainops_devcluster.demo.inference_server", "--port", str(port), *args]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        process.stdout.readline()  # listening
        return process, f"http://127.0.0.1:{port}"

    def get(url: str) -> int | str:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError as error:
            return type(error).__name__

    for args, expected in ((("--shutdown-timeout", "0"), "aborted"), (("--shutdown-timeout", "5"), 200)):
        process, url = run("--service-ms", "1500", "--load-seconds", "0.5", *args)
        try:
            assert get(f"{url}/health") == 503 and get(f"{url}/v1/infer") == 503
            time.sleep(0.8)
            assert get(f"{url}/health") == 200
            result: list = []
            asking = threading.Thread(
                target=lambda result=result, url=url: result.append(get(f"{url}/v1/infer"))
            )
            asking.start()
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            asking.join()
            answer = result[0]
            assert (answer == 200) if expected == 200 else (answer != 200), (args, answer)
            assert process.wait(10) == 0
        finally:
            process.kill()
            process.wait()


def test_the_return_takes_an_unsafe_companions_pods_out_of_their_service_before_it_shrinks(
    make_devcluster, caplog, tmp_path
):
    """A workload without a clean hand-off offloaded to the virtual node: the return's waves take each
    companion pod out of its Service before the companion's scale-down removes it, and evict those
    their ReplicaSet let go of.  The return runs as the workers' ServiceAccount with deploy/rbac.yaml
    applied (least privilege: pods may be listed, not read one by one), and leaves no pod behind."""
    from tests.e2e.conftest import RBAC, WORKER
    from trainops.kube.client import Kube

    chat = InferenceWorkload(
        "chat",
        4,
        min_available=2,
        server=True,
        server_args=("--service-ms", "50"),
        overflow=True,
        handoff=False,
    )
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    cluster = make_devcluster(nodes=6, virtual_nodes=1, inference=[chat], process_env=env)
    default_seeded_objects(cluster)
    nodes = nodes_by_app(cluster)["chat"][:2]
    kube = kube_for(cluster)
    summary = claim(
        kube, RUN, nodes, cluster_queue="training", deployments=[CHAT], endpoint_propagation_s=0.2
    )
    assert summary.offloaded == {f"Deployment {CHAT}": 2}
    cluster.create_from_file(RBAC)
    worker = Kube.from_kubeconfig(str(cluster.service_account_kubeconfig(*WORKER, tmp_path / "worker")))
    cluster.server.audit.clear()
    caplog.clear()
    with caplog.at_level("INFO"):
        give_back(worker, RUN, cluster_queue="training", wave_nodes=1, endpoint_propagation_s=0.2)
    assert caplog.text.count("out of its Service(s) (labels app removed) before it gets SIGTERM") == 2
    assert cluster.store.find("deployments.apps", "inference", "chat-overflow") is None
    denied = [(e["method"], e["path"]) for e in cluster.server.audit.entries() if e["status"] in (401, 403)]
    assert denied == []
    orphans = [
        p["metadata"]["name"]
        for p in cluster.store.list("pods", "inference")[0]
        if not p["metadata"].get("deletionTimestamp")
        and not any(o.get("controller") for o in p["metadata"].get("ownerReferences") or [])
    ]
    assert orphans == []


def test_an_overflow_pool_is_judged_by_requests_served_through_the_service(make_devcluster, caplog):
    """Overflow replicas without a probe are Ready before their model loads (as a Virtual Kubelet
    provider reports what it likes): with a serve_check the claim shrinks the primary only once a
    round of requests through the Service is served whole; one that is never served fails the claim."""
    from trainops.capacity.procedure import Deadlines
    from trainops.kube.retry import DeadlineExceeded

    chat = InferenceWorkload(
        "chat", 4, min_available=2, server=True, server_args=("--load-seconds", "3"), handoff=False
    )
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    cluster = make_devcluster(nodes=6, virtual_nodes=1, inference=[chat], process_env=env)
    default_seeded_objects(cluster)
    time.sleep(3)  # the primaries loaded their models
    url = f"http://{cluster.service_address('inference', 'chat', 80)}/health"
    pool = {"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider"}
    nodes = nodes_by_app(cluster)["chat"][:2]
    kube = kube_for(cluster)
    with caplog.at_level("INFO"):
        summary = claim(
            kube,
            RUN,
            nodes,
            cluster_queue="training",
            deployments=[CHAT],
            overflow_pool={**pool, "serve_check": {"url": url, "requests": 12}},
            endpoint_propagation_s=0.2,
        )
    assert summary.offloaded == {f"Deployment {CHAT}": 2}
    assert f"overflow pool: 12 of 12 requests through {url} served" in caplog.text
    give_back(kube, RUN, cluster_queue="training", endpoint_propagation_s=0.2)

    never = {**pool, "serve_check": {"url": "http://127.0.0.1:9/health", "requests": 2}}
    with pytest.raises(DeadlineExceeded, match="overflow pool Ready but not serving"):
        claim(
            kube,
            RUN,
            nodes,
            cluster_queue="training",
            deployments=[CHAT],
            overflow_pool=never,
            deadlines=Deadlines(ready_s=3),
        )
    give_back(kube, RUN, cluster_queue="training", endpoint_propagation_s=0.2)


def test_without_the_safe_way_the_same_servers_fail_requests(make_devcluster):
    """The control: pods of the same bare workload deleted as a plain scale-down or eviction would
    (SIGTERM at once, no preStop) abort the requests they have in flight."""
    chat = InferenceWorkload(
        "chat",
        6,
        min_available=0,
        server=True,
        server_args=("--service-ms", "400", "--slots", "4"),
        handoff=False,
    )
    cluster = start(make_devcluster, chat)
    time.sleep(2)
    load = Load(cluster.service_address("inference", "chat", 80), rate=30).start()
    try:
        time.sleep(1)
        load.phase("deleted")
        kube = kube_for(cluster)
        from trainops.kube.client import PODS

        for pod in [p for p in cluster.store.list("pods", "inference")[0]][:4]:
            kube.request("DELETE", PODS.path("inference", pod["metadata"]["name"]), "delete pod")
            time.sleep(0.3)
        time.sleep(1)
    finally:
        load.stop()
    rows = {row.phase: row for row in load.report()}
    assert rows["deleted"].failed > 0, rows["deleted"].line()


def test_waiting_for_pods_to_leave_their_service_lists_a_namespaces_endpointslices_once_a_round(
    make_devcluster,
):
    """Six pods out of their Service at once: the wait lists the namespace's EndpointSlices once per
    round (every 0.5 s), not once per pod (every 0.1 s): the API server's load does not grow with them."""
    from trainops.capacity.handoff import SafeDrain
    from trainops.kube.client import PODS
    from trainops.kube.retry import Deadline

    cluster = start(make_devcluster, bare_chat(), proxy_lag_s=0.0)
    kube = kube_for(cluster)
    safe = SafeDrain(kube, propagation_s=1.0)
    pods = kube.list(PODS, "inference", labels="app=chat")
    assert len(pods) == 6
    detached = safe.detach(pods, Deadline(30), keep={"app"})
    cluster.server.audit.clear()
    safe.wait_detached(detached, Deadline(60))
    lists = [
        e["time"]
        for e in cluster.server.audit.entries()
        if e["method"] == "GET" and "/namespaces/inference/endpointslices" in e["path"]
    ]
    assert lists
    assert all(later - earlier >= 0.4 for earlier, later in zip(lists, lists[1:], strict=False)), lists


def test_a_released_pod_its_budget_keeps_is_named_not_silently_left(make_devcluster, caplog):
    """A pod its ReplicaSet let go of whose eviction its budget keeps refusing: asked again until the
    deadline, then a warning names it (it still runs, out of its Service)."""
    import logging

    from trainops.capacity.procedure import _evict_orphans
    from trainops.kube.client import PDBS, PODS
    from trainops.kube.retry import Deadline

    cluster = make_devcluster(nodes=2)
    kube = kube_for(cluster)
    meta = {"name": "released", "namespace": "inference", "labels": {"kept": "yes"}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "example/server"}]},
    }
    pod["spec"]["nodeName"] = cluster.store.list("nodes", "")[0][0]["metadata"]["name"]
    kube.create(pod, PODS)
    for _ in range(100):  # Running and Ready: its budget counts it
        if (cluster.store.find("pods", "inference", "released").get("status") or {}).get(
            "phase"
        ) == "Running":
            break
        time.sleep(0.1)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "kept", "namespace": "inference"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"kept": "yes"}}},
    }
    kube.create(budget, PDBS)
    with caplog.at_level("WARNING"):
        _evict_orphans(kube, [pod], Deadline(1.0), logging.getLogger("test"))
    assert "pod inference/released: released by its ReplicaSet and not evicted in time" in caplog.text
    assert cluster.store.find("pods", "inference", "released") is not None
