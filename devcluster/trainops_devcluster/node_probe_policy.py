"""``deploy/node-probe-admission.yaml``, enforced: the node probe may change only its own node.

The devcluster does not serve ValidatingAdmissionPolicies; it always applies this one, the
policy's CEL validations written out in Python in the same order with the same messages, to
requests of the probe's ServiceAccount (``tests/devcluster/test_rbac.py`` checks both against
the manifest).  The node is the one the probe's token is bound to
(``authentication.kubernetes.io/node-name``, from a TokenRequest bound to its Pod or Node).
A denial is answered as kube-apiserver answers a policy's ``Deny``: 422 ``Invalid``, the object
named "forbidden" with the message ``ValidatingAdmissionPolicy '<policy>' with binding
'<binding>' denied request: ...``.

The devcluster's own probe daemon (``probe_daemon.py``) writes the store directly, as its other
controllers do, so this applies to probes that talk to the API server (``trainops probe
--publish`` with the ServiceAccount's token), not to it.
"""

from __future__ import annotations

from trainops_devcluster.authn import NODE_NAME, User
from trainops_devcluster.errors import AdmissionDenied

POLICY = BINDING = "trainops-node-probe-own-node"
PROBE_USER = "system:serviceaccount:kube-system:trainops-node-probe"
_MATCHED = {("nodes", ""), ("nodes", "status"), ("configmaps", "")}
_OPERATIONS = ("CREATE", "UPDATE", "DELETE")


def check(
    user: User,
    operation: str,
    resource: str,
    subresource: str,
    namespace: str,
    obj: dict | None,
    old: dict | None,
) -> None:
    """Raise ``AdmissionDenied`` if the policy denies this write (``obj``: the new object, ``None``
    for a DELETE; ``old``: the stored one, ``None`` for a CREATE)."""
    if user.name != PROBE_USER or operation not in _OPERATIONS or (resource, subresource) not in _MATCHED:
        return
    name = ((obj or old or {}).get("metadata") or {}).get("name", "")
    denial = _denial(user, operation, resource, subresource, namespace, name, obj, old)
    if denial:
        raise AdmissionDenied(
            f"ValidatingAdmissionPolicy '{POLICY}' with binding '{BINDING}' denied request: {denial}",
            resource=resource,
            name=name,
        )


def _denial(
    user: User,
    operation: str,
    resource: str,
    subresource: str,
    namespace: str,
    name: str,
    obj: dict | None,
    old: dict | None,
) -> str | None:
    node = (user.extra.get(NODE_NAME) or [""])[0]
    report = "node-health-" + node
    if node == "":
        return (
            "the node probe's token is not bound to a node (needs node-bound ServiceAccount tokens, "
            "Kubernetes 1.30+)"
        )
    if operation == "DELETE":
        return "the node probe deletes nothing"
    if resource == "nodes" and name != node:
        return f"the node probe on {node} may not change node {name}"
    if resource == "nodes" and subresource != "status" and (obj or {}).get("spec") != (old or {}).get("spec"):
        return "the node probe may not change a node's spec (taints, unschedulable)"
    if resource == "configmaps" and not (
        namespace == "trainops-system"
        and (name == report or (len(report) > 253 and name.startswith(report[:242])))
    ):
        return f"the node probe on {node} may write only ConfigMap trainops-system/{report}"
    return None
