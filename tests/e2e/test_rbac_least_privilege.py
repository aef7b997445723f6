"""``deploy/rbac.yaml`` grants what the package calls and nothing more, judged from the devcluster's
audit log of real runs (the lifecycle's clean path, an XID resume, the reaper) made as the Airflow
workers' ServiceAccount with the manifest applied: the devcluster enforces RBAC, so no call of the
package may have been denied (401/403 in the audit log), and every grant must have been used."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from trainops_devcluster import rbac, topology

from tests.e2e.conftest import DAG_ID, RBAC, WORKER, lifecycle_conf, xid_mid_run
from trainops.capacity.procedure import claim
from trainops.cli import main
from trainops.conventions import HEALTH_NAMESPACE
from trainops.permissions import ACCOUNTS, CLUSTER, TRAINING, permissions_of

WORKER_USER = "system:serviceaccount:{}:{}".format(*WORKER)
SERVICE_ACCOUNT = {  # the Helm chart's accounts deploy/rbac.yaml binds, by trainops.permissions' names
    "worker": WORKER,
    "triggerer": ("airflow", "airflow-triggerer"),
    "api-server": ("airflow", "airflow-api-server"),
}
# Grants for what the devcluster does not run: an HPA over an inference Deployment, KServe, a Job
# without a Kueue Workload (GangCluster.stop deletes the Job then; otherwise it deactivates the Workload),
# and the OwnerReferencesPermissionEnforcement admission plugin (creating the Job's Service, which it owns).
ONLY_WITH_INTEGRATIONS = {
    ("autoscaling", "horizontalpodautoscalers", "get"),
    ("autoscaling", "horizontalpodautoscalers", "patch"),
    ("serving.kserve.io", "inferenceservices", "get"),
    ("serving.kserve.io", "inferenceservices", "list"),
    ("serving.kserve.io", "inferenceservices", "patch"),
    ("batch", "jobs", "delete"),
    ("", "services", "delete"),
}
# The evidence wait's watch on nodes (GangCluster.node_changes) runs only when a node reports its fault
# after its pods failed: most XID runs here (the devcluster's probe round is 1 s), not every one.
# tests/training/test_blame_evidence.py drives it on purpose.
ONLY_WHEN_A_REPORT_LAGS = {("", "nodes", "watch")}
# The safe hand-off lists Services and EndpointSlices only for a workload that lacks a clean one (no
# preStop, no readinessProbe): the devcluster's seeded workloads have both.
# tests/capacity/test_handoff_devcluster.py drives it.
ONLY_FOR_AN_UNSAFE_HANDOFF = {("", "services", "list"), ("discovery.k8s.io", "endpointslices", "list")}


def attributes_of(entry: dict) -> rbac.Attributes:
    """What the API server's authorizer was asked about an audited request."""
    split = urlsplit(entry["path"])
    return rbac.attributes(entry["method"], split.path, dict(parse_qsl(split.query)))


def grants(account: tuple[str, str] = WORKER) -> list[tuple[str | None, str, str, str]]:
    """(namespace or None for cluster-wide, group, resource, verb) deploy/rbac.yaml grants ``account``
    ((namespace, name) of a ServiceAccount; the workers' by default)."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs if "rules" in d
    }
    found = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any((s.get("namespace"), s["name"]) == account for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace")  # None: a ClusterRoleBinding
        ref = binding["roleRef"]
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    found += [(scope, group, resource, verb) for verb in rule["verbs"]]
    return found


@pytest.fixture
def audited(cluster, api, s3, bucket, run_dag, worker_kubeconfig) -> list[dict]:
    """The package's API calls (audit entries) over a clean lifecycle run (its displaced inference
    offloaded to a virtual node and moved back), an XID resume and a reap."""
    from kubernetes import client

    client.CoreV1Api(api).create_node(topology.virtual_node(0, 8))  # an overflow pool, as an admin adds one
    cluster.server.audit.clear()
    assert (
        run_dag(DAG_ID, lifecycle_conf(bucket, "rbac", overflow_pool=topology.VIRTUAL_POOL)).state
        == "success"
    )
    # an XID mid-run: the failure is judged (pod logs, nodes), the node quarantined, the run resumed
    xid_mid_run(cluster, api, s3, f"s3://{bucket}/runs/rbac-xid/")
    assert run_dag(DAG_ID, lifecycle_conf(bucket, "rbac-xid")).state == "success"
    from trainops.kube.client import Kube

    kube = Kube.from_kubeconfig(str(worker_kubeconfig))
    # a claim that lends from no workload: the drain evicts the inference pod on its node (PDBs honoured)
    busy = next(
        p["spec"]["nodeName"]
        for p in cluster.store.list("pods", "inference")[0]
        if "trainops.io/quarantine" not in str(cluster.store.get("nodes", "", p["spec"]["nodeName"])["spec"])
    )
    assert claim(kube, "gone_dag/manual__1", [busy], cluster_queue="training").evictions == 1
    args = ["capacity", "reap", "--kubeconfig", str(worker_kubeconfig), "--grace", "0"]
    assert main([*args, "--airflow-url", "http://127.0.0.1:9"]) == 0  # unknown: kept, nothing written
    return [e for e in cluster.server.audit.entries() if e["user"] == WORKER_USER]


def test_no_call_is_denied_and_every_grant_is_used(audited):
    denied = sorted({(e["status"], e["method"], e["path"]) for e in audited if e["status"] in (401, 403)})
    assert denied == [], f"calls of the package the API server refused: {denied}"
    requests = [attributes_of(e) for e in audited]
    used = {(a.group, a.resource_path, a.verb) for a in requests if a.resource_request}
    unused = sorted(
        {(g, r, v) for _, g, r, v in grants()}
        - used
        - ONLY_WITH_INTEGRATIONS
        - ONLY_WHEN_A_REPORT_LAGS
        - ONLY_FOR_AN_UNSAFE_HANDOFF
    )
    assert unused == [], f"grants never used: {unused}"


@pytest.mark.parametrize("account", ACCOUNTS)
def test_rbac_yaml_grants_each_account_what_the_package_declares(account):
    """trainops.permissions (what ``trainops doctor`` asks the API server for) is what rbac.yaml grants."""
    namespaces = {CLUSTER: None, TRAINING: "training", HEALTH_NAMESPACE: HEALTH_NAMESPACE}
    declared = sorted(
        (namespaces[p.namespace] or "", p.group, p.resource, p.verb) for p in permissions_of(account)
    )
    assert sorted((ns or "", g, r, v) for ns, g, r, v in grants(SERVICE_ACCOUNT[account])) == declared


def test_the_probe_admission_policy_names_the_probes_service_account():
    """deploy/node-probe-admission.yaml applies to the identity deploy/node-probe.yaml runs the probe as."""
    deploy = RBAC.parent
    probe = [d for d in yaml.safe_load_all((deploy / "node-probe.yaml").read_text()) if d]
    account = next(d for d in probe if d["kind"] == "ServiceAccount")["metadata"]
    policy = next(d for d in yaml.safe_load_all((deploy / "node-probe-admission.yaml").read_text()) if d)
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert policy["spec"]["matchConditions"][0]["expression"] == f"request.userInfo.username == '{username}'"
