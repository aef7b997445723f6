"""``deploy/rbac.yaml`` grants what the package calls and nothing more, judged from the devcluster's
audit log of real runs (the lifecycle's clean path, an XID resume, the reaper): every call the
package made is allowed to the Airflow workers' ServiceAccount, and every grant is used.

The devcluster does not enforce RBAC (nor authenticate); this evaluates the manifests' rules the way
the API server's RBAC authorizer does: a ClusterRole bound cluster-wide allows in every namespace,
a Role only in its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import DAG_ID, lifecycle_conf, training_running
from tests.e2e.test_lifecycle import running_training_pod
from tests.training.conftest import when
from trainops.capacity.procedure import claim
from trainops.cli import main

RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"
SUBJECT = ("airflow", "airflow-worker")
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


def request_of(entry: dict) -> tuple[str, str, str, str]:
    """(namespace, group, resource[/subresource], verb) of an audited API call."""
    parts = entry["path"].split("?")[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    return namespace, group, resource, entry["verb"]


def grants() -> list[tuple[str | None, str, str, str]]:
    """(namespace or None for cluster-wide, group, resource, verb) granted to SUBJECT."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs if "rules" in d
    }
    found = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any((s.get("namespace"), s["name"]) == SUBJECT for s in binding["subjects"]):
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
def audited(cluster, api, s3, bucket, run_dag):
    """The package's API calls over a clean lifecycle run, a gate from the CLI and a reap."""
    cluster.server.audit.clear()
    assert run_dag(DAG_ID, lifecycle_conf(bucket, "rbac")).state == "success"
    # an XID mid-run: the failure is judged (pod logs, nodes), the node quarantined, the run resumed
    run_uri = f"s3://{bucket}/runs/rbac-xid/"

    def inject():
        cluster.inject("xid", running_training_pod(api, "1")["spec"]["nodeName"], code=79)

    when(lambda: training_running(s3, run_uri, 25)() and running_training_pod(api, "1"), inject)
    assert run_dag(DAG_ID, lifecycle_conf(bucket, "rbac-xid")).state == "success"
    from trainops.kube.client import Kube

    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    claim(kube, "gone_dag/manual__1", ["gpu-node-007"], cluster_queue="training")
    args = ["capacity", "reap", "--kubeconfig", str(cluster.kubeconfig), "--grace", "0"]
    assert main([*args, "--airflow-url", "http://127.0.0.1:9"]) == 0  # unknown: kept, nothing written
    return [request_of(e) for e in cluster.server.audit.entries() if e["status"] != 404 or e["verb"] != "get"]


def test_every_call_is_granted_and_every_grant_is_used(audited):
    granted = grants()
    allowed = {(scope, group, resource, verb) for scope, group, resource, verb in granted}

    def allows(namespace: str, group: str, resource: str, verb: str) -> bool:
        return (None, group, resource, verb) in allowed or (namespace, group, resource, verb) in allowed

    denied = sorted({call for call in audited if not allows(*call)})
    assert denied == [], f"calls deploy/rbac.yaml does not allow: {denied}"
    used = {(group, resource, verb) for _, group, resource, verb in audited}
    unused = sorted({(g, r, v) for _, g, r, v in granted} - used - ONLY_WITH_INTEGRATIONS)
    assert unused == [], f"grants never used: {unused}"


def test_the_probe_admission_policy_names_the_probes_service_account():
    """deploy/node-probe-admission.yaml applies to the identity deploy/node-probe.yaml runs the probe as."""
    deploy = RBAC.parent
    probe = [d for d in yaml.safe_load_all((deploy / "node-probe.yaml").read_text()) if d]
    account = next(d for d in probe if d["kind"] == "ServiceAccount")["metadata"]
    policy = next(d for d in yaml.safe_load_all((deploy / "node-probe-admission.yaml").read_text()) if d)
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert policy["spec"]["matchConditions"][0]["expression"] == f"request.userInfo.username == '{username}'"
