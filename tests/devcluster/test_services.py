"""Services and EndpointSlices: how process pods reach each other by cluster DNS names, and how a
ClusterIP Service balances connections over its Ready endpoints (the devcluster's kube-proxy)."""

from __future__ import annotations

import http.client
import json
import os
import sys

import pytest
from trainops_devcluster.loopback import Loopback
from trainops_devcluster.podutil import delete_pod
from trainops_devcluster.runtime import LOCAL_IMAGE
from trainops_devcluster.store import Store

from tests.devcluster.ctrl_support import NS, control_plane, job, node, pod, wait_for

SLICES = "endpointslices.discovery.k8s.io"


def headless(name: str, selector: dict, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "rdzv", "port": 29500}],
            **spec,
        },
    }


def test_headless_service_owned_by_a_job_lists_its_pods_by_hostname_and_goes_away_with_it(k8s):
    from kubernetes import client

    core, batch = client.CoreV1Api(k8s), client.BatchV1Api(k8s)
    body = job("gang", completions=2, parallelism=2)
    body["spec"]["template"]["spec"]["subdomain"] = "gang"
    body["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    created = batch.create_namespaced_job(NS, body)
    service = headless("gang", {"batch.kubernetes.io/job-name": "gang"}, publishNotReadyAddresses=True)
    service["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "gang", "uid": created.metadata.uid}
    ]
    made = core.create_namespaced_service(NS, service)
    assert made.spec.cluster_ip == "None" and made.spec.ports[0].protocol == "TCP"
    assert made.spec.ports[0].target_port == 29500

    discovery = client.DiscoveryV1Api(k8s)

    def hostnames() -> list[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            NS, label_selector="kubernetes.io/service-name=gang"
        )
        return sorted(e.hostname for s in slices.items for e in s.endpoints or [] if e.hostname)

    assert wait_for(lambda: hostnames() == ["gang-0", "gang-1"])
    (found,) = discovery.list_namespaced_endpoint_slice(NS).items
    assert found.metadata.owner_references[0].kind == "Service" and found.ports[0].port == 29500
    assert all(e.target_ref.kind == "Pod" and e.addresses for e in found.endpoints)

    batch.delete_namespaced_job("gang", NS, propagation_policy="Background")
    assert wait_for(lambda: not core.list_namespaced_service(NS).items)
    assert wait_for(lambda: not discovery.list_namespaced_endpoint_slice(NS).items)


def labelled(obj: dict, **labels) -> dict:
    obj["metadata"]["labels"] = labels
    return obj


def test_a_service_lists_only_ready_pods_unless_it_publishes_not_ready_addresses():
    unready = pod("unready")  # one container runs on, the other has exited: Running, not Ready
    unready["spec"]["containers"].append({"name": "done", "image": LOCAL_IMAGE, "command": ["true"]})
    with control_plane(node("a")) as plane:
        plane.store.create("pods", labelled(pod("ready"), app="x"))
        plane.store.create("pods", labelled(unready, app="x"))
        plane.store.create("pods", labelled(pod("other"), app="y"))
        plane.store.create("services", headless("strict", {"app": "x"}))
        plane.store.create("services", headless("eager", {"app": "x"}, publishNotReadyAddresses=True))

        def endpoints(service: str) -> dict[str, bool]:
            return {
                e["targetRef"]["name"]: e["conditions"]["ready"]
                for s in plane.store.list(SLICES, NS)[0]
                if s["metadata"]["labels"]["kubernetes.io/service-name"] == service
                for e in s["endpoints"]
            }

        plane.wait(lambda: endpoints("eager") == {"ready": True, "unready": False})
        plane.wait(lambda: endpoints("strict") == {"ready": True})


def test_process_pods_reach_rank_zero_by_its_dns_name_on_a_port_of_their_job():
    script = "import json, os; print(json.dumps({k: os.environ[k] for k in ('MASTER_ADDR', 'MASTER_PORT', 'RDZV_ENDPOINT', 'OTHER_ADDR')}))"

    def member(name: str, subdomain: str) -> dict:
        env = [
            {"name": "MASTER_ADDR", "value": f"{subdomain}-0.{subdomain}.{NS}.svc"},
            {"name": "MASTER_PORT", "value": "29500"},
            {"name": "RDZV_ENDPOINT", "value": f"{subdomain}.{NS}.svc.cluster.local:29400"},
            {"name": "OTHER_ADDR", "value": f"{subdomain}-0.missing.{NS}.svc"},
        ]
        container = {"command": [sys.executable, "-c", script], "env": env}
        return labelled(
            pod(name, gpus=0, image=LOCAL_IMAGE, container=container, hostname=name, subdomain=subdomain),
            job=subdomain,
        )

    with control_plane(node("a")) as plane:
        for group in ("one", "two"):
            plane.store.create("services", headless(group, {"job": group}))
            for index in range(2):
                plane.store.create("pods", member(f"{group}-{index}", group))
        seen = {}
        for name in ("one-0", "one-1", "two-0"):
            plane.wait_phase(name, "Succeeded")
            seen[name] = json.loads(plane.logs.read(NS, name))
    assert {s["MASTER_ADDR"] for s in seen.values()} == {"127.0.0.1"}
    assert seen["one-0"]["MASTER_PORT"] == seen["one-1"]["MASTER_PORT"] != seen["two-0"]["MASTER_PORT"]
    assert seen["one-0"]["RDZV_ENDPOINT"].startswith("127.0.0.1:") and not seen["one-0"][
        "RDZV_ENDPOINT"
    ].endswith(":29400")
    assert (
        seen["one-0"]["OTHER_ADDR"] == f"one-0.missing.{NS}.svc"
    )  # no such Service: left to fail as DNS would


def test_a_pods_own_name_resolves_only_under_a_headless_service():
    store = Store()
    store.create("services", headless("gang", {"job": "gang"}))
    store.create("services", headless("vip", {"job": "vip"}, clusterIP="10.96.0.10"))
    for group in ("gang", "vip"):
        store.create("pods", labelled(pod(f"{group}-0", hostname=f"{group}-0", subdomain=group), job=group))
    loopback = Loopback(store)

    assert loopback.service_for(f"gang-0.gang.{NS}.svc", NS)["metadata"]["name"] == "gang"
    assert loopback.service_for(f"vip.{NS}.svc", NS)["metadata"]["name"] == "vip"
    assert loopback.service_for(f"vip-0.vip.{NS}.svc", NS) is None  # no such record on a real cluster


def server_pod(name: str, probe_path: str = "/healthz") -> dict:
    """A process pod running the demo inference server on containerPort 8080, probed for readiness."""
    container = {
        "command": [sys.executable, "-m", "trainops_devcluster.demo.inference_server", "--service-ms", "0"]
        + ["--drain-seconds", "20"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 1},
    }
    return labelled(pod(name, gpus=0, image=LOCAL_IMAGE, container=container), app="web")


def ask(address: str) -> str:
    """The pod that answered one request through the Service ("refused" when none did)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/v1/infer")
        return json.loads(connection.getresponse().read())["pod"]
    except (OSError, http.client.HTTPException):
        return "refused"
    finally:
        connection.close()


def ready(plane, name: str) -> bool:
    found = plane.pod(name)
    return bool(found) and any(
        c["type"] == "Ready" and c["status"] == "True" for c in found["status"].get("conditions", [])
    )


@pytest.mark.servers
def test_a_cluster_ip_service_balances_over_its_ready_endpoints_as_kube_proxy_does():
    """Round-robin over the Ready endpoints only: a pod whose readiness probe fails gets nothing, nor
    does one that is terminating (it still serves the requests it has); with none left, connections
    are refused."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "clusterIP": "10.96.0.20",
            "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080}],
        },
    }
    with control_plane(node("a"), process_env={"PATH": os.path.dirname(sys.executable)}) as plane:
        plane.store.create("services", service)
        for name in ("web-0", "web-1"):
            plane.store.create("pods", server_pod(name))
        plane.store.create("pods", server_pod("web-sick", probe_path="/missing"))  # its probe gets a 404
        address = (
            f"127.0.0.1:{plane.controllers.runtime.loopback.port(plane.store.get('services', NS, 'web'), 80)}"
        )
        plane.wait(lambda: ready(plane, "web-0") and ready(plane, "web-1"))
        plane.wait(lambda: sorted(ask(address) for _ in range(2)) == ["web-0", "web-1"])

        answers = [ask(address) for _ in range(6)]
        assert sorted(answers) == ["web-0"] * 3 + ["web-1"] * 3 and answers[0] != answers[1]
        running = plane.pod("web-sick")
        assert running["status"]["phase"] == "Running" and not ready(plane, "web-sick")

        delete_pod(plane.store, NS, "web-1")  # it serves on for 20 s before it exits
        plane.wait(lambda: [ask(address) for _ in range(4)] == ["web-0"] * 4)
        assert plane.pod("web-1")["status"]["phase"] == "Running"

        delete_pod(plane.store, NS, "web-0")
        plane.wait(lambda: ask(address) == "refused")
