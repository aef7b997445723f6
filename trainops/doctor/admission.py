"""The node probe's admission policies (deploy/node-probe-admission.yaml) are there, bound with
``Deny``, match the account the probe DaemonSet runs as, and type-check cleanly on this server.

Without them a probe's node-bound token can change its own node's labels, annotations and status
(release its own quarantine, report more GPUs than it has): RBAC cannot say "only your own node".
"""

from __future__ import annotations

from trainops.doctor.gpu_operator import probe_daemon_set
from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem
from trainops.kube.client import Kind

GROUP, VERSION = "admissionregistration.k8s.io", "v1"
#: the policies deploy/node-probe-admission.yaml ships (a test keeps the two the same)
POLICIES = ("trainops-node-probe-own-node", "trainops-node-probe-own-report")
APPLY = "kubectl apply -f deploy/node-probe-admission.yaml"
POLICY_KIND = Kind(GROUP, VERSION, "validatingadmissionpolicies", namespaced=False)
BINDING_KIND = Kind(GROUP, VERSION, "validatingadmissionpolicybindings", namespaced=False)


def _policy_problems(policy: dict, bindings: list[dict], account: str | None) -> list[Problem]:
    name = policy["metadata"]["name"]
    problems = []
    bound = [b for b in bindings if (b.get("spec") or {}).get("policyName") == name]
    if not any("Deny" in ((b.get("spec") or {}).get("validationActions") or []) for b in bound):
        problems.append(
            Problem(
                f"ValidatingAdmissionPolicy {name} is not bound with validationActions [Deny]"
                + (f" (bound: {', '.join(b['metadata']['name'] for b in bound)})" if bound else ""),
                f"{APPLY}: a policy without a Deny binding refuses nothing",
            )
        )
    expressions = " ".join(
        c.get("expression", "") for c in (policy.get("spec") or {}).get("matchConditions") or []
    )
    if account and f"'{account}'" not in expressions:
        problems.append(
            Problem(
                f"ValidatingAdmissionPolicy {name} does not match {account}, the account the probe "
                "DaemonSet runs as: its writes are not confined",
                "run the probe as kube-system/trainops-node-probe (deploy/node-probe.yaml), or name your "
                "account in the policy's matchConditions",
            )
        )
    warnings = ((policy.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings") or []
    problems += [
        Problem(
            f"ValidatingAdmissionPolicy {name}: {w.get('fieldRef')}: {w.get('warning')}",
            f"{APPLY} from this trainops version (its rules type-check on Kubernetes 1.30+)",
        )
        for w in warnings
    ]
    return problems


def check(reads: Reads, config) -> Outcome:
    if "validatingadmissionpolicies" not in (reads.served_resources(GROUP, VERSION) or set()):
        return Outcome(
            "no ValidatingAdmissionPolicy API",
            [
                Problem(
                    f"the API server does not serve {GROUP}/{VERSION} ValidatingAdmissionPolicies (Kubernetes "
                    "1.30+): nothing keeps a node probe to its own facts",
                    "upgrade the control plane to Kubernetes 1.30 or newer, then " + APPLY,
                )
            ],
        )
    bindings = reads.list(BINDING_KIND)
    daemon_set = probe_daemon_set(reads, config)
    account = None
    if daemon_set is not None:
        spec = daemon_set["spec"]["template"].get("spec") or {}
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        account = f"system:serviceaccount:{config.probe[0]}:{sa}"
    problems = []
    for name in POLICIES:
        policy = reads.get(POLICY_KIND, name)
        if policy is None:
            problems.append(Problem(f"ValidatingAdmissionPolicy {name} does not exist", APPLY))
        else:
            problems += _policy_problems(policy, bindings, account)
    summary = f"{', '.join(POLICIES)}: " + (
        "not in force"
        if problems
        else "present, bound with Deny" + (f", matching {account}" if account else "")
    )
    return Outcome(summary, problems)
