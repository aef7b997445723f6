"""``trainops doctor`` against a devcluster set up as the README says (every check ok, nothing written),
then set up wrong in one way at a time: the check for that names the problem and its fix, and every
other check stays ok.  One cluster for the module; each case undoes what it broke."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path

import pytest
from trainops_devcluster import topology

from tests.devcluster.ctrl_support import wait_for
from tests.devcluster.kubectl_support import kubectl
from tests.e2e.test_rbac_least_privilege import attributes_of
from tests.health.driver_upgrade_support import label_gpu_clients
from trainops.cli import main
from trainops.conventions import GPU_POOL_LABEL, HEALTH_NAMESPACE
from trainops.doctor.admission import POLICIES
from trainops.doctor.gpu_operator import CLIENT_LABEL, CUSTOM_LABEL_ENV, PAUSED
from trainops.doctor.namespaces import ENFORCE
from trainops.health.published import configmap_name
from trainops.permissions import TRIGGERER, WORKER, permissions_of

REPO = Path(__file__).parents[2]
README_STEPS = ["namespaces", "kueue-queues", "rbac", "node-probe", "node-probe-admission"]
GPU_NODES = ["gpu-node-000", "gpu-node-001", "gpu-node-002"]
PROBE = ("daemonsets.apps", "kube-system", "trainops-node-probe")
# ClusterPolicy spec.driver.manager.env that has the driver manager pause the client label
CLIENT_PAUSED = [{"name": CUSTOM_LABEL_ENV, "value": CLIENT_LABEL}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A fresh devcluster with the README's manifests applied in order, its probes running and scraped."""
    from trainops_devcluster.cluster import DevCluster

    with DevCluster(nodes=len(GPU_NODES), fresh=True, inference=[], prometheus=True) as dev:
        dev.wait_until_settled()
        # the devcluster's GPU Operator is v25.10.0: set up as deploy/node-probe.yaml says for operators
        # before v26.7.0, so a driver upgrade pauses the probe by its client label
        label_gpu_clients(dev)
        patch(
            dev,
            "clusterpolicy",
            "cluster-policy",
            body={"spec": {"driver": {"manager": {"env": CLIENT_PAUSED}}}},
        )
        for step in README_STEPS:
            dev.create_from_file(REPO / "deploy" / f"{step}.yaml")
        # the devcluster's GPU nodes offer rdma/ib: the README's RDMA step (IPC_LOCK needs privileged)
        run(dev, "label", "namespace", "training", f"{ENFORCE}=privileged", "--overwrite")
        dev.create_from_file(REPO / "deploy" / "doctor-rbac.yaml")
        wait_for(lambda: probes_ready(dev) == set(GPU_NODES), "a ready probe pod on every GPU node")
        dev.probe_daemon.wait_rounds(1)
        dev.wait_until_scraped()
        dev.worker_kubeconfig = dev.service_account_kubeconfig(
            "airflow", "airflow-worker", tmp_path_factory.mktemp("worker") / "kubeconfig"
        )
        yield dev


def probes_ready(cluster) -> set[str]:
    pods = cluster.store.list("pods", "kube-system")[0]
    return {
        p["spec"].get("nodeName")
        for p in pods
        if p["metadata"].get("labels", {}).get("app") == "trainops-node-probe"
        and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])
        )
    }


def probes_rolled(cluster) -> bool:
    """Every GPU node has a ready probe pod of the DaemonSet's current template, and no other."""
    daemon_set = cluster.store.get(*PROBE)
    status = daemon_set.get("status") or {}
    pods = [
        p
        for p in cluster.store.list("pods", "kube-system")[0]
        if p["metadata"].get("labels", {}).get("app") == "trainops-node-probe"
    ]
    return (
        status.get("observedGeneration") == daemon_set["metadata"].get("generation")
        and status.get("updatedNumberScheduled") == status.get("numberReady") == len(pods) == len(GPU_NODES)
        and probes_ready(cluster) == set(GPU_NODES)
    )


def doctor(cluster, capsys, *args: str, kubeconfig: Path | None = None) -> tuple[int, dict]:
    """``trainops doctor --json`` as a user runs it; (exit code, findings by check)."""
    capsys.readouterr()
    argv = [
        "doctor",
        "--kubeconfig",
        str(kubeconfig or cluster.kubeconfig),
        "--prometheus",
        cluster.prometheus_url,
    ]
    code = main([*argv, "--json", *args])  # a later --prometheus "" names none
    out = capsys.readouterr().out
    return code, {c["check"]: c for c in json.loads(out)["checks"]}


def only_problem(findings: dict, check: str) -> list[dict]:
    """The problems of ``check``, after asserting that it is the one check with any."""
    wrong = {name: f["status"] for name, f in findings.items() if f["status"] not in ("ok", "skipped")}
    assert wrong == {check: "problem"}, findings
    return findings[check]["problems"]


def test_all_ok_on_a_cluster_set_up_as_the_readme_says_and_nothing_is_written(cluster, capsys):
    cluster.server.audit.clear()
    capsys.readouterr()
    code = main(["doctor", "--kubeconfig", str(cluster.kubeconfig), "--prometheus", cluster.prometheus_url])
    text = capsys.readouterr().out.splitlines()
    assert code == 0, "\n".join(text)
    checks = [line for line in text[1:-1] if not line.startswith(" ")]
    assert len(checks) == 10 and all(line.startswith("ok ") for line in checks), text
    assert text[-1] == "10 checks: 10 ok"
    made = {(e["method"], attributes_of(e).resource) for e in cluster.server.audit.entries()}
    assert {method for method, _ in made} == {"GET", "POST"}
    assert {resource for method, resource in made if method == "POST"} == {"selfsubjectaccessreviews"}


def test_as_the_worker_with_its_grants_every_check_reads_what_it_needs(cluster, capsys):
    cluster.server.audit.clear()
    code, findings = doctor(cluster, capsys, kubeconfig=cluster.worker_kubeconfig)
    assert code == 0, findings
    refused = [e for e in cluster.server.audit.entries() if e["status"] in (401, 403)]
    assert refused == []
    granted = findings["permissions"]["summary"]
    assert (
        granted
        == f"{len(permissions_of(WORKER))} of {len(permissions_of(WORKER))} permissions the worker uses are granted"
    )


def test_permissions_each_verb_the_account_lacks_is_named(cluster, capsys):
    """The triggerer's token asked about the worker's verbs: exactly those the worker has and it has not."""
    triggerer = cluster.service_account_kubeconfig(
        "airflow", "airflow-triggerer", cluster.kubeconfig.parent / "t"
    )
    code, findings = doctor(cluster, capsys, "--account", WORKER, kubeconfig=triggerer)
    assert code == 1
    lacking = {
        (p.verb, p.resource, p.namespace)
        for p in set(permissions_of(WORKER)) - set(permissions_of(TRIGGERER))
    }
    problems = findings["permissions"]["problems"]
    assert len(problems) == len(lacking) > 0
    assert any("may not create pods/eviction cluster-wide" in p["what"] for p in problems)
    assert all("deploy/rbac.yaml" in p["fix"] for p in problems)
    refused = findings[
        "daemonset-tolerations"
    ]  # the doctor's own reads: deploy/doctor-rbac.yaml binds the worker
    assert refused["status"] == "failed" and refused["summary"].startswith("the API refused a read: ")
    assert "deploy/doctor-rbac.yaml" in refused["problems"][0]["fix"]
    code, findings = doctor(cluster, capsys, "--account", TRIGGERER, kubeconfig=triggerer)
    assert findings["permissions"]["status"] == "ok"


def test_a_check_that_cannot_finish_fails_alone_with_its_reason(cluster, capsys):
    """Every DaemonSet list answered 503: the tolerations check retries until its deadline, the rest answer."""
    cluster.server.faults.add(r"^/apis/apps/v1/daemonsets", 503, fraction=1.0)
    try:
        code, findings = doctor(cluster, capsys, "--check-deadline", "3")
    finally:
        cluster.server.faults.clear()
    assert code == 1
    failed = findings.pop("daemonset-tolerations")
    assert failed["status"] == "failed" and failed["summary"].startswith(
        "did not finish within 3s: list daemonsets.apps: kept failing with 503"
    )
    assert "--check-deadline" in failed["problems"][0]["fix"]
    assert {f["status"] for f in findings.values()} == {"ok"}


def test_an_unreachable_cluster_exits_2(tmp_path, capsys, cluster):
    config = cluster.kubeconfig.read_text().replace(cluster.url, "http://127.0.0.1:9")
    (tmp_path / "kubeconfig").write_text(config)
    assert main(["doctor", "--kubeconfig", str(tmp_path / "kubeconfig"), "--check-deadline", "2"]) == 2
    assert "cannot read the cluster at http://127.0.0.1:9" in capsys.readouterr().err


# ---- set up wrong, one way at a time -------------------------------------------------------------
def run(cluster, *args: str, stdin: str | None = None) -> None:
    kubectl(cluster.kubeconfig, *args, stdin=stdin)


def patch(cluster, *target: str, body: dict, subresource: str = "") -> None:
    extra = [f"--subresource={subresource}"] if subresource else []
    run(cluster, "patch", *target, "--type=merge", "-p", json.dumps(body), *extra)


def restored(cluster, obj: dict) -> None:
    """Put ``obj`` (as stored before) back through the API."""
    clean = {k: v for k, v in obj.items() if k != "status"}
    clean["metadata"] = {
        k: obj["metadata"][k] for k in ("name", "namespace", "labels") if k in obj["metadata"]
    }
    run(cluster, "apply", "-f", "-", stdin=json.dumps(clean))


@contextlib.contextmanager
def runtime_class_deleted(cluster):
    before = copy.deepcopy(cluster.store.get("runtimeclasses.node.k8s.io", "", "nvidia"))
    run(cluster, "delete", "runtimeclass", "nvidia")
    yield
    restored(cluster, before)


@contextlib.contextmanager
def operator_not_ready(cluster):
    patch(
        cluster,
        "clusterpolicy",
        "cluster-policy",
        body={"status": {"state": "notReady"}},
        subresource="status",
    )
    yield
    patch(
        cluster, "clusterpolicy", "cluster-policy", body={"status": {"state": "ready"}}, subresource="status"
    )


@contextlib.contextmanager
def probe_without_runtime_class(cluster):
    target = ("daemonset", "-n", "kube-system", "trainops-node-probe")
    before = cluster.store.get(*PROBE)["spec"]["template"]["spec"].get("runtimeClassName")
    patch(cluster, *target, body={"spec": {"template": {"spec": {"runtimeClassName": None}}}})
    wait_for(lambda: probes_rolled(cluster), "the probe pods rolled")
    yield
    patch(cluster, *target, body={"spec": {"template": {"spec": {"runtimeClassName": before}}}})
    wait_for(lambda: probes_rolled(cluster), "the probe pods rolled back")


@contextlib.contextmanager
def node_without_gpu_present_label(cluster):
    run(cluster, "label", "node", "gpu-node-001", "nvidia.com/gpu.present-")
    wait_for(lambda: "gpu-node-001" not in probes_ready(cluster), "the probe pod gone from gpu-node-001")
    yield
    run(cluster, "label", "node", "gpu-node-001", "nvidia.com/gpu.present=true")
    wait_for(lambda: probes_ready(cluster) == set(GPU_NODES), "the probe pod back on gpu-node-001")


@contextlib.contextmanager
def node_paused_for_a_driver_upgrade(cluster):
    run(cluster, "label", "--overwrite", "node", "gpu-node-001", f"{CLIENT_LABEL}={PAUSED}")
    wait_for(lambda: "gpu-node-001" not in probes_ready(cluster), "the probe pod gone from gpu-node-001")
    yield
    run(cluster, "label", "--overwrite", "node", "gpu-node-001", f"{CLIENT_LABEL}=true")
    wait_for(lambda: probes_ready(cluster) == set(GPU_NODES), "the probe pod back on gpu-node-001")


@contextlib.contextmanager
def probe_not_following_the_client_label(cluster):
    target = ("daemonset", "-n", "kube-system", "trainops-node-probe")
    patch(cluster, *target, body={"spec": {"template": {"spec": {"nodeSelector": {CLIENT_LABEL: None}}}}})
    wait_for(lambda: probes_rolled(cluster), "the probe pods rolled")
    yield
    patch(cluster, *target, body={"spec": {"template": {"spec": {"nodeSelector": {CLIENT_LABEL: "true"}}}}})
    wait_for(lambda: probes_rolled(cluster), "the probe pods rolled back")


@contextlib.contextmanager
def driver_manager_not_pausing_the_client_label(cluster):
    policy = ("clusterpolicy", "cluster-policy")
    patch(cluster, *policy, body={"spec": {"driver": {"manager": {"env": []}}}})
    yield
    patch(cluster, *policy, body={"spec": {"driver": {"manager": {"env": CLIENT_PAUSED}}}})


@contextlib.contextmanager
def probe_stopped_an_hour_ago(cluster):
    """gpu-node-002's probe stopped publishing an hour ago: its telemetry is gone, its report old."""
    name = configmap_name("gpu-node-002")
    before = copy.deepcopy(cluster.store.get("configmaps", HEALTH_NAMESPACE, name))
    cluster.inject("telemetry-missing", "gpu-node-002")
    report = json.loads(before["data"]["report.json"])
    report["collected_at"] = time.time() - 3600
    cluster.store.mutate(
        "configmaps",
        HEALTH_NAMESPACE,
        name,
        lambda cm: cm["data"].update({"report.json": json.dumps(report)}),
    )
    yield
    cluster.inject("repair", "gpu-node-002")
    cluster.wait_until_scraped()
    cluster.store.mutate("configmaps", HEALTH_NAMESPACE, name, lambda cm: cm["data"].update(before["data"]))


@contextlib.contextmanager
def exporter_without(cluster, metric: str):
    """dcgm-exporter's counters CSV without ``metric``, on every node."""
    for node in GPU_NODES:
        cluster.telemetry[node].exported.discard(metric)
    cluster.wait_until_scraped()
    yield
    for node in GPU_NODES:
        cluster.telemetry[node].exported.add(metric)
    cluster.wait_until_scraped()


@contextlib.contextmanager
def nothing_changed(cluster):
    yield


@contextlib.contextmanager
def priority_class_deleted(cluster):
    before = copy.deepcopy(
        cluster.store.get("workloadpriorityclasses.kueue.x-k8s.io", "", "training-standard")
    )
    run(cluster, "delete", "workloadpriorityclass", "training-standard")
    yield
    restored(cluster, before)


@contextlib.contextmanager
def label_removed(cluster, node: str, label: str):
    before = cluster.store.get("nodes", "", node)["metadata"]["labels"][label]
    run(cluster, "label", "node", node, f"{label}-")
    yield
    run(cluster, "label", "node", node, f"{label}={before}")


@contextlib.contextmanager
def local_queue_feeding(cluster, other: str):
    target = ("localqueue", "-n", "training", "training")
    patch(cluster, *target, body={"spec": {"clusterQueue": other}})
    yield
    patch(cluster, *target, body={"spec": {"clusterQueue": "training"}})


def chart_default_daemon_set() -> dict:
    """A GPU Operator operand as the chart makes it without deploy/gpu-operator-values.yaml."""
    labels = {"app": "nvidia-driver-daemonset"}
    spec = {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "driver", "image": "nvcr.io/nvidia/driver:580"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-driver-daemonset",
            "namespace": "gpu-operator",
            "labels": {**labels, "app.kubernetes.io/managed-by": "gpu-operator"},
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


@contextlib.contextmanager
def operand_with_chart_tolerations(cluster):
    run(cluster, "create", "namespace", "gpu-operator")
    run(cluster, "apply", "-f", "-", stdin=json.dumps(chart_default_daemon_set()))
    yield
    run(cluster, "delete", "namespace", "gpu-operator")
    wait_for(
        lambda: cluster.store.find(*PROBE[:1], "gpu-operator", "nvidia-driver-daemonset") is None,
        "the DaemonSet gone",
    )


@contextlib.contextmanager
def cluster_policy_with_chart_tolerations(cluster):
    default = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    patch(cluster, "clusterpolicy", "cluster-policy", body={"spec": {"daemonsets": {"tolerations": default}}})
    yield
    body = {"spec": {"daemonsets": {"tolerations": topology.GPU_OPERATOR_TOLERATIONS}}}
    patch(cluster, "clusterpolicy", "cluster-policy", body=body)


@contextlib.contextmanager
def namespace_enforcing(cluster, namespace: str, level: str):
    before = cluster.store.get("namespaces", "", namespace)["metadata"].get("labels", {}).get(ENFORCE)
    run(cluster, "label", "namespace", namespace, f"{ENFORCE}={level}", "--overwrite")
    yield
    run(
        cluster,
        "label",
        "namespace",
        namespace,
        f"{ENFORCE}={before}" if before else f"{ENFORCE}-",
        "--overwrite",
    )


@contextlib.contextmanager
def restricted_without_rdma(cluster):
    """No GPU node offers an rdma/ resource (a cluster without RDMA), and training enforces restricted."""
    offered = {
        name: cluster.store.get("nodes", "", name)["status"]["allocatable"]["rdma/ib"] for name in GPU_NODES
    }
    for name in GPU_NODES:
        gone = {"capacity": {"rdma/ib": None}, "allocatable": {"rdma/ib": None}}
        patch(cluster, "node", name, body={"status": gone}, subresource="status")
    with namespace_enforcing(cluster, "training", "restricted"):
        yield
    for name, count in offered.items():
        back = {"capacity": {"rdma/ib": count}, "allocatable": {"rdma/ib": count}}
        patch(cluster, "node", name, body={"status": back}, subresource="status")


@contextlib.contextmanager
def binding_deleted(cluster, name: str):
    run(cluster, "delete", "validatingadmissionpolicybinding", name)
    yield
    cluster.create_from_file(REPO / "deploy" / "node-probe-admission.yaml")


WRONG = {
    # id: (the setup, doctor arguments, the check that must say so, in its problem, in its fix)
    "runtime-class-missing": (runtime_class_deleted, (), "gpu-operator", "RuntimeClass nvidia (ClusterPolicy spec.operator.runtimeClass) does not exist", "container toolkit"),
    "operator-not-ready": (operator_not_ready, (), "gpu-operator", "ClusterPolicy cluster-policy is notReady", "kubectl get pods -n gpu-operator"),
    "probe-without-runtime-class-under-cdi": (probe_without_runtime_class, (), "gpu-operator", "CDI is on, and the probe DaemonSet kube-system/trainops-node-probe runs with the default runtime", "runtimeClassName: nvidia"),
    "probe-stays-through-driver-upgrades": (probe_not_following_the_client_label, (), "gpu-operator", f"its nodeSelector has no label the driver manager sets to {PAUSED}", f'add {CLIENT_LABEL}: "true" to its nodeSelector'),
    "client-label-not-paused": (driver_manager_not_pausing_the_client_label, (), "gpu-operator", f"it selects nodes by {CLIENT_LABEL}, which the driver manager of GPU Operator v25.10.0 (older than v0.12.0) does not set", f"{CUSTOM_LABEL_ENV}={CLIENT_LABEL} in ClusterPolicy spec.driver.manager.env"),
    "probe-not-on-a-gpu-node": (node_without_gpu_present_label, (), "node-probe", "gpu-node-001: no probe pod: the node does not match the DaemonSet's nvidia.com/gpu.present=true", "GPU Feature Discovery"),
    "probe-paused-for-a-driver-upgrade": (node_paused_for_a_driver_upgrade, (), "node-probe", f"gpu-node-001: no probe pod: GPU Operator's driver manager paused it for a driver upgrade ({CLIENT_LABEL}={PAUSED})", "wait for the upgrade"),
    "stale-report": (probe_stopped_an_hour_ago, ("--prometheus", ""), "probe-reports", "gpu-node-002: its report is 3600s old", "kubectl logs -n kube-system"),
    "metric-not-exported": (lambda c: exporter_without(c, "DCGM_FI_DEV_ROW_REMAP_PENDING"), (), "dcgm-exporter", "no DCGM_FI_DEV_ROW_REMAP_PENDING series: the gate reads row_remap_pending", "deploy/dcgm-exporter-counters.csv enables it"),
    "wrong-node-label": (nothing_changed, ("--prometheus-node-label", "UUID"), "dcgm-exporter", "the gate keys dcgm-exporter's series by label 'UUID', which names no GPU node; 'Hostname' does", "--prometheus-node-label) to Hostname"),
    "priority-class-missing": (priority_class_deleted, (), "kueue-queues", "WorkloadPriorityClass 'training-standard' does not exist: Kueue would make no Workload", "deploy/kueue-queues.yaml"),
    "topology-label-missing": (lambda c: label_removed(c, "gpu-node-001", topology.BLOCK_LABEL), (), "kueue-queues", f"1 of 3 node(s) of ResourceFlavor gpu lack the label {topology.BLOCK_LABEL} of Topology gpu-topology (e.g. gpu-node-001)", "or remove the flavor's topologyName"),
    "local-queue-elsewhere": (lambda c: local_queue_feeding(c, "other"), (), "kueue-queues", "LocalQueue training/training sends runs to ClusterQueue 'other', but the claim raises", "deploy/kueue-queues.yaml"),
    "operand-without-trainops-tolerations": (operand_with_chart_tolerations, (), "daemonset-tolerations", "DaemonSet gpu-operator/nvidia-driver-daemonset does not tolerate trainops.io/mode=inference:NoSchedule", "deploy/gpu-operator-values.yaml"),
    "cluster-policy-without-trainops-tolerations": (cluster_policy_with_chart_tolerations, (), "daemonset-tolerations", "ClusterPolicy cluster-policy spec.daemonsets.tolerations lacks trainops.io/mode=inference:NoSchedule", "deploy/gpu-operator-values.yaml"),
    "training-restricted": (lambda c: namespace_enforcing(c, "training", "restricted"), (), "namespaces", "namespace training enforces Pod Security restricted; GPU nodes offer rdma/ib", f"{ENFORCE}=privileged"),
    "restricted-without-rdma": (restricted_without_rdma, (), "namespaces", "namespace training enforces Pod Security restricted; the training pods need baseline", f"{ENFORCE}=baseline"),
    "rdma-under-baseline": (lambda c: namespace_enforcing(c, "training", "baseline"), (), "namespaces", "GPU nodes offer rdma/ib: runs that ask for it add IPC_LOCK and need privileged", f"{ENFORCE}=privileged"),
    "probe-namespace-baseline": (lambda c: namespace_enforcing(c, "kube-system", "baseline"), (), "namespaces", "namespace kube-system enforces Pod Security baseline; the node probe", f"kubectl label namespace kube-system {ENFORCE}=privileged"),
    "policy-unbound": (lambda c: binding_deleted(c, POLICIES[1]), (), "probe-admission", f"ValidatingAdmissionPolicy {POLICIES[1]} is not bound with validationActions [Deny]", "deploy/node-probe-admission.yaml"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRONG))
def test_set_up_wrong_in_one_way_the_check_for_it_names_the_problem_and_its_fix(cluster, capsys, case):
    setup, args, check, what, fix = WRONG[case]
    with setup(cluster):
        code, findings = doctor(cluster, capsys, *args)
    assert code == 1
    problems = only_problem(findings, check)
    assert any(what in p["what"] and fix in p["fix"] for p in problems), problems
    assert doctor(cluster, capsys)[0] == 0, "the case undid what it broke"


def test_a_tas_flavor_selecting_every_node_needs_fabric_labels_only_on_the_gpu_nodes(cluster, capsys):
    """A flavor without nodeLabels selects the system (CPU) nodes too, which carry no fabric labels and host
    no training pod: not a problem."""
    patch(cluster, "resourceflavor", "gpu", body={"spec": {"nodeLabels": None}})
    try:
        system = [n for n in cluster.store.list("nodes")[0] if n["metadata"]["name"] not in GPU_NODES]
        assert system and all(topology.BLOCK_LABEL not in n["metadata"]["labels"] for n in system)
        code, findings = doctor(cluster, capsys)
    finally:
        patch(cluster, "resourceflavor", "gpu", body={"spec": {"nodeLabels": {GPU_POOL_LABEL: "true"}}})
    assert code == 0 and findings["kueue-queues"]["status"] == "ok", findings["kueue-queues"]


def test_without_kueue_the_kueue_checks_say_to_install_it(make_devcluster, capsys):
    cluster = make_devcluster(nodes=1, inference=[], kueue=False)
    capsys.readouterr()
    assert main(["doctor", "--kubeconfig", str(cluster.kubeconfig), "--json"]) == 1
    findings = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    for check in ("kueue", "kueue-queues"):
        (problem,) = findings[check]["problems"]
        assert "the cluster serves kueue.x-k8s.io versions none" in problem["what"]
        assert problem["fix"].startswith("install Kueue 0.13 or newer (its CRDs and controller)")
