"""Every kind of the devcluster README's compatibility table, through every verb, with the official
client's dynamic client and with stock kubectl."""

from __future__ import annotations

import json
import select
import subprocess

import pytest
import yaml
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

from tests.devcluster.kubectl_support import kubectl as run_kubectl
from tests.devcluster.local_api import LocalApi

KUEUE = "kueue.x-k8s.io/v1beta2"
RBAC = "rbac.authorization.k8s.io/v1"
TEMPLATE = {
    "metadata": {"labels": {"app": "compat"}},
    "spec": {"containers": [{"name": "main", "image": "registry.example/compat:1.0"}]},
}
SELECTOR = {"matchLabels": {"app": "compat"}}
# (apiVersion, kind, namespaced, body without apiVersion/kind/metadata)
EXAMPLES = [
    ("v1", "Namespace", False, {}),
    ("v1", "Node", False, {"spec": {}}),
    ("v1", "Pod", True, {"spec": TEMPLATE["spec"]}),
    (
        "v1",
        "Event",
        True,
        {"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Compat", "type": "Normal"},
    ),
    ("v1", "ConfigMap", True, {"data": {"k": "v"}}),
    ("v1", "Secret", True, {"stringData": {"k": "v"}}),
    ("v1", "ServiceAccount", True, {}),
    ("apps/v1", "Deployment", True, {"spec": {"replicas": 0, "selector": SELECTOR, "template": TEMPLATE}}),
    ("apps/v1", "DaemonSet", True, {"spec": {"selector": SELECTOR, "template": TEMPLATE}}),
    (
        "batch/v1",
        "Job",
        True,
        {
            "spec": {
                "suspend": True,
                "template": {**TEMPLATE, "spec": {**TEMPLATE["spec"], "restartPolicy": "Never"}},
            }
        },
    ),
    ("policy/v1", "PodDisruptionBudget", True, {"spec": {"minAvailable": 1, "selector": SELECTOR}}),
    (RBAC, "ClusterRole", False, {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
    (
        RBAC,
        "ClusterRoleBinding",
        False,
        {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "x"},
            "subjects": [],
        },
    ),
    (RBAC, "Role", True, {"rules": []}),
    (
        RBAC,
        "RoleBinding",
        True,
        {"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"}},
    ),
    (KUEUE, "ResourceFlavor", False, {"spec": {}}),
    (KUEUE, "ClusterQueue", False, {"spec": {"namespaceSelector": {}, "resourceGroups": []}}),
    (KUEUE, "LocalQueue", True, {"spec": {"clusterQueue": "compat"}}),
    (KUEUE, "WorkloadPriorityClass", False, {"value": 10}),
    (
        KUEUE,
        "Workload",
        True,
        {"spec": {"active": False, "podSets": [{"name": "main", "count": 1, "template": TEMPLATE}]}},
    ),
]
IDS = [kind for _, kind, _, _ in EXAMPLES]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = LocalApi(tmp_path_factory.mktemp("compat"))
    yield server
    server.close()


def manifest(api_version: str, kind: str, namespaced: bool, body: dict, name: str, labels: dict) -> dict:
    meta = {"name": name, "labels": labels, **({"namespace": "default"} if namespaced else {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **json.loads(json.dumps(body))}


@pytest.mark.parametrize(("api_version", "kind", "namespaced", "body"), EXAMPLES, ids=IDS)
def test_official_client_drives_every_verb(api, api_version, kind, namespaced, body):
    resource = dynamic.DynamicClient(api.client).resources.get(api_version=api_version, kind=kind)
    ns = {"namespace": "default"} if namespaced else {}
    name = f"client-{kind.lower()}"
    created = resource.create(
        body=manifest(api_version, kind, namespaced, body, name, {"compat": "client"}), **ns
    )
    assert created.metadata.name == name and created.metadata.managedFields[0].operation == "Update"
    listed = resource.get(label_selector="compat=client", **ns)
    assert [item.metadata.name for item in listed.items] == [name]

    watched = resource.watch(resource_version=listed.metadata.resourceVersion, timeout=5, **ns)
    current = resource.get(name=name, **ns).to_dict()
    current["metadata"]["labels"]["updated"] = "yes"
    replaced = resource.replace(body=current, **ns)
    assert replaced.metadata.labels["updated"] == "yes"
    event = next(e for e in watched if e["object"].metadata.name == name)
    assert event["type"] == "MODIFIED"

    patched = resource.patch(
        name=name,
        body={"metadata": {"annotations": {"a": "1"}}},
        content_type="application/merge-patch+json",
        **ns,
    )
    assert patched.metadata.annotations["a"] == "1"
    applied = resource.server_side_apply(
        body={
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "labels": {"applied": "yes"}},
        },
        field_manager="compat",
        **ns,
    )
    assert applied.metadata.labels["applied"] == "yes" and applied.metadata.labels["compat"] == "client"
    resource.delete(name=name, **ns)
    second = manifest(api_version, kind, namespaced, body, f"{name}-2", {"compat": "client"})
    resource.create(body=second, **ns)
    resource.delete(label_selector="compat=client", **ns)  # deletecollection
    leftovers = [
        item.metadata.name
        for item in resource.get(label_selector="compat=client", **ns).items
        if not item.metadata.deletionTimestamp
    ]
    assert leftovers == []
    with pytest.raises(ApiException) as missing:
        resource.get(name=f"{name}-3", **ns)
    assert missing.value.status == 404


@pytest.mark.parametrize(("api_version", "kind", "namespaced", "body"), EXAMPLES, ids=IDS)
def test_kubectl_drives_every_verb(api, api_version, kind, namespaced, body):
    def kubectl(*args: str, stdin: str | None = None) -> str:
        return run_kubectl(api.kubeconfig, *args, stdin=stdin).stdout

    name = f"kubectl-{kind.lower()}"
    group = api_version.split("/")[0] if "/" in api_version else ""
    plural = {
        "PodDisruptionBudget": "poddisruptionbudgets",
        "WorkloadPriorityClass": "workloadpriorityclasses",
    }.get(kind, kind.lower() + ("es" if kind.endswith("s") else "s"))
    target = f"{plural}.{group}" if group else plural
    obj = manifest(api_version, kind, namespaced, body, name, {"compat": "kubectl"})
    assert "created" in kubectl("create", "-f", "-", stdin=yaml.safe_dump(obj))
    assert kubectl("get", target, "-l", "compat=kubectl").splitlines()[0].split()[0] in (
        "NAME",
        "LAST",
    )  # a Table
    assert kubectl("get", target, "-l", "compat=kubectl", "-o", "name").split() == [
        f"{kind.lower()}{'.' + group if group else ''}/{name}"
    ]
    assert json.loads(kubectl("get", target, name, "-o", "json"))["metadata"]["name"] == name
    watch = ["kubectl", "--kubeconfig", str(api.kubeconfig), "get", target, name, "--watch", "-o", "name"]
    watching = subprocess.Popen(watch, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:  # the watch's first event is the object as it is; then it streams on until stopped
        assert select.select([watching.stdout], [], [], 30)[0], "kubectl's watch printed nothing in 30 s"
        assert name in watching.stdout.readline()
        with pytest.raises(subprocess.TimeoutExpired):
            watching.wait(timeout=0.5)
    finally:
        watching.kill()
        watching.wait()
    kubectl("label", target, name, "step=label")  # patch
    kubectl("annotate", target, name, "note=merge", "--overwrite")
    current = json.loads(kubectl("get", target, name, "-o", "json"))
    current["metadata"]["labels"]["step"] = "replace"
    kubectl("replace", "-f", "-", stdin=json.dumps(current))  # update
    obj["metadata"]["labels"]["applied"] = "yes"
    assert "serverside-applied" in kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(obj)
    )
    stored = json.loads(kubectl("get", target, name, "-o", "json"))["metadata"]
    assert stored["labels"]["applied"] == "yes" and stored["annotations"]["note"] == "merge"
    kubectl("delete", target, name, "--wait=false")
    assert kubectl("get", target, "-l", "compat=kubectl", "-o", "name") == ""
