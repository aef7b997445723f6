"""Every Kubernetes permission trainops uses, per account that runs it: the one table.

``deploy/rbac.yaml`` grants exactly these (``tests/e2e/test_rbac_least_privilege.py`` keeps the two
equal and checks, from real runs' audit logs, that the package calls nothing else), and
``trainops doctor`` asks the API server for each of them (SelfSubjectAccessReview).  The accounts
are the Airflow processes that run trainops code (the official Helm chart's service accounts):
``worker`` (the tasks), ``triggerer`` (the deferred waits, following and resuming a run) and
``api-server`` (the UI plugin).  A permission's namespace is ``CLUSTER`` (cluster-wide),
``TRAINING`` (the training namespace, ``training`` by default) or ``HEALTH_NAMESPACE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainops.conventions import HEALTH_NAMESPACE

WORKER, TRIGGERER, API_SERVER = "worker", "triggerer", "api-server"
ACCOUNTS = (WORKER, TRIGGERER, API_SERVER)
CLUSTER, TRAINING = "", "training"
_ALL, _RUN, _CAPACITY = ACCOUNTS, (WORKER, TRIGGERER), (WORKER, API_SERVER)


@dataclass(frozen=True)
class Permission:
    verb: str
    group: str
    resource: str  # with its subresource: "pods/eviction"
    namespace: str  # CLUSTER, TRAINING or HEALTH_NAMESPACE
    accounts: tuple[str, ...]
    why: str

    def where(self, training_namespace: str) -> str:
        """The namespace to ask about (``TRAINING`` becomes the cluster's training namespace)."""
        return training_namespace if self.namespace == TRAINING else self.namespace

    def __str__(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {what}" + (f" in {self.namespace}" if self.namespace else " (cluster-wide)")


def _grant(verbs: str, group: str, resource: str, namespace: str, accounts, why: str) -> list[Permission]:
    return [Permission(v, group, resource, namespace, tuple(accounts), why) for v in verbs.split()]


PERMISSIONS: tuple[Permission, ...] = tuple(
    p
    for grant in (
        _grant("get list patch", "", "nodes", CLUSTER, _ALL, "health gate, quarantine and release, claim and return, fleet view"),
        _grant("watch", "", "nodes", CLUSTER, _RUN, "judging a failed attempt: wait for its nodes' reports"),
        _grant("get list patch", "apps", "deployments", CLUSTER, _CAPACITY, "inference capacity lent to training"),
        _grant("delete", "apps", "deployments", CLUSTER, _CAPACITY, "an overflow companion the return emptied"),
        _grant("create", "apps", "deployments", CLUSTER, (WORKER,), "an inference workload's overflow companion"),
        _grant("get list patch", "autoscaling", "horizontalpodautoscalers", CLUSTER, _CAPACITY, "an inference HPA's bounds"),
        _grant("get list patch", "serving.kserve.io", "inferenceservices", CLUSTER, _CAPACITY, "KServe's minReplicas"),
        _grant("get patch", "kueue.x-k8s.io", "clusterqueues", CLUSTER, _CAPACITY, "the training queue's GPU quota"),
        _grant("list", "", "pods", CLUSTER, (WORKER,), "the claim's drain: pods on the claimed nodes"),
        _grant("patch", "", "pods", CLUSTER, (WORKER,), "the claim: its pods on the claimed nodes go first (deletion cost)"),
        _grant("create", "", "pods/eviction", CLUSTER, (WORKER,), "the claim's drain (PDBs honoured)"),
        _grant("list", "policy", "poddisruptionbudgets", CLUSTER, (WORKER,), "the claim's drain"),
        _grant("list", "", "services", CLUSTER, (WORKER,), "the claim's safe hand-off: the Services a pod leaves before SIGTERM"),
        _grant("list", "discovery.k8s.io", "endpointslices", CLUSTER, (WORKER,), "the claim's safe hand-off: a pod goes once no EndpointSlice lists it"),
        _grant("get list delete", "batch", "jobs", TRAINING, _ALL, "stopping a run"),
        _grant("patch", "batch", "jobs", TRAINING, _ALL, "the run's ledger: an attempt's judged end, a stop"),
        _grant("list", "", "pods", TRAINING, _ALL, "stopping a run, reading its attempt"),
        _grant("list patch", "kueue.x-k8s.io", "workloads", TRAINING, _ALL, "stopping a run (spec.active=false)"),
        _grant("watch", "batch", "jobs", TRAINING, _RUN, "following a run"),
        _grant("watch", "", "pods", TRAINING, _RUN, "following a run"),
        _grant("watch", "kueue.x-k8s.io", "workloads", TRAINING, _RUN, "following a run"),
        _grant("list watch", "", "events", TRAINING, _RUN, "following a run: its Job's FailedCreate events"),
        _grant("get", "kueue.x-k8s.io", "localqueues", TRAINING, (WORKER,), "the claim's queue check"),
        _grant("get", "kueue.x-k8s.io", "workloadpriorityclasses", CLUSTER, (WORKER,), "the claim's queue check: the run's priority class"),
        _grant("get", "kueue.x-k8s.io", "resourceflavors", CLUSTER, (WORKER,), "the training task's check: does its ClusterQueue place by TAS (one pod per node)"),
        _grant("create", "batch", "jobs", TRAINING, _RUN, "submitting an attempt"),
        _grant("create delete", "", "pods", TRAINING, (WORKER,), "the claim's image pulls onto its nodes (hot spares)"),
        _grant("get", "", "pods/log", TRAINING, _RUN, "a failed pod's log tail"),
        _grant("create delete", "", "services", TRAINING, _RUN, "each attempt's headless Service"),
        _grant("get", "", "configmaps", HEALTH_NAMESPACE, _ALL, "one node's probe report"),
        _grant("list", "", "configmaps", HEALTH_NAMESPACE, _RUN, "every node's probe report (the gate)"),
    )
    for p in grant
)  # fmt: skip


def permissions_of(account: str) -> list[Permission]:
    """What ``account`` needs."""
    if account not in ACCOUNTS:
        raise ValueError(f"account must be one of {', '.join(ACCOUNTS)}, got {account!r}")
    return [p for p in PERMISSIONS if account in p.accounts]
