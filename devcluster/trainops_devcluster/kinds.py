"""The one registry of the kinds the devcluster serves, and the discovery documents built from it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

KUEUE = "kueue.x-k8s.io"
# The Kueue API version a devcluster serves: v1beta2 (Kueue >= 0.15; the default) or v1beta1 (Kueue 0.13,
# which serves no other).  A real Kueue 0.15+ serves both through its conversion webhook; see README.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
RBAC = "rbac.authorization.k8s.io"  # enforced by rbac.py
ADMISSION = "admissionregistration.k8s.io"  # enforced by admission_policy.py
K8S_VERSION = "1.33.0"


@dataclass(frozen=True)
class Column:
    """A Table column: ``path`` is a dotted JSON path (``[?type==X]`` picks a list item by type)."""

    name: str
    path: str
    type: str = "string"
    priority: int = 0


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    #: OpenAPI definition of a built-in kind; ``None`` for custom resources (no strategic merge patch).
    schema: str | None = None
    #: DNS-1123 "subdomain" (253 chars, dots allowed) or "label" (63 chars) names.
    name_rule: str = "subdomain"
    #: printer columns of a custom resource (built-in kinds have theirs in tables.py).
    columns: tuple[Column, ...] = field(default=())

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def resource(self) -> str:
        """The Store's key: ``plural`` for core, ``plural.group`` otherwise."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def custom(self) -> bool:
        return self.schema is None

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def verbs(self) -> list[str]:
        return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


_STATUS = ("status",)
_AGE = Column("Age", ".metadata.creationTimestamp", "date")

KINDS: tuple[Kind, ...] = (
    Kind(
        "",
        "v1",
        "Namespace",
        "namespaces",
        False,
        ("ns",),
        (),
        _STATUS,
        "io.k8s.api.core.v1.Namespace",
        "label",
    ),
    Kind("", "v1", "Node", "nodes", False, ("no",), (), _STATUS, "io.k8s.api.core.v1.Node"),
    Kind(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        ("po",),
        ("all",),
        ("status", "eviction", "log", "binding"),
        "io.k8s.api.core.v1.Pod",
    ),
    Kind("", "v1", "Event", "events", True, ("ev",), (), (), "io.k8s.api.core.v1.Event"),
    Kind("", "v1", "ConfigMap", "configmaps", True, ("cm",), (), (), "io.k8s.api.core.v1.ConfigMap"),
    Kind("", "v1", "Secret", "secrets", True, (), (), (), "io.k8s.api.core.v1.Secret"),
    Kind(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        True,
        ("sa",),
        (),
        ("token",),
        "io.k8s.api.core.v1.ServiceAccount",
    ),
    Kind(
        "",
        "v1",
        "Service",
        "services",
        True,
        ("svc",),
        ("all",),
        _STATUS,
        "io.k8s.api.core.v1.Service",
        "label",
        columns=(
            Column("Type", ".spec.type"),
            Column("Cluster-IP", ".spec.clusterIP"),
            _AGE,
        ),
    ),
    Kind(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        True,
        schema="io.k8s.api.discovery.v1.EndpointSlice",
        columns=(Column("AddressType", ".addressType"), _AGE),
    ),
    Kind(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        True,
        ("deploy",),
        ("all",),
        ("status", "scale"),
        "io.k8s.api.apps.v1.Deployment",
    ),
    Kind(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        True,
        ("ds",),
        ("all",),
        _STATUS,
        "io.k8s.api.apps.v1.DaemonSet",
    ),
    Kind("batch", "v1", "Job", "jobs", True, (), ("all",), _STATUS, "io.k8s.api.batch.v1.Job"),
    Kind(RBAC, "v1", "ClusterRole", "clusterroles", False, schema="io.k8s.api.rbac.v1.ClusterRole"),
    Kind(
        RBAC,
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        False,
        schema="io.k8s.api.rbac.v1.ClusterRoleBinding",
    ),
    Kind(RBAC, "v1", "Role", "roles", True, schema="io.k8s.api.rbac.v1.Role"),
    Kind(RBAC, "v1", "RoleBinding", "rolebindings", True, schema="io.k8s.api.rbac.v1.RoleBinding"),
    Kind(
        ADMISSION,
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        False,
        (),
        ("api-extensions",),
        _STATUS,
        "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicy",
    ),
    Kind(
        ADMISSION,
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
        (),
        ("api-extensions",),
        schema="io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicyBinding",
    ),
    Kind(
        "node.k8s.io",
        "v1",
        "RuntimeClass",
        "runtimeclasses",
        False,
        schema="io.k8s.api.node.v1.RuntimeClass",
        columns=(Column("Handler", ".handler"), _AGE),
    ),
    # NVIDIA GPU Operator's custom resource (its CRD ``clusterpolicies.nvidia.com``): how the operator
    # runs the driver, toolkit, device plugin and dcgm-exporter, and its state.
    Kind(
        "nvidia.com",
        "v1",
        "ClusterPolicy",
        "clusterpolicies",
        False,
        (),
        (),
        _STATUS,
        columns=(Column("Status", ".status.state"), _AGE),
    ),
    Kind(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        True,
        ("pdb",),
        (),
        _STATUS,
        "io.k8s.api.policy.v1.PodDisruptionBudget",
    ),
    Kind(
        KUEUE,
        "v1beta2",
        "ResourceFlavor",
        "resourceflavors",
        False,
        ("flavor", "flavors", "rf"),
        columns=(_AGE,),
    ),
    Kind(
        KUEUE,
        "v1beta2",
        "ClusterQueue",
        "clusterqueues",
        False,
        ("cq",),
        (),
        _STATUS,
        columns=(
            Column("Cohort", ".spec.cohortName"),
            Column("Strategy", ".spec.queueingStrategy", priority=1),
            Column("Pending Workloads", ".status.pendingWorkloads", "integer"),
            Column("Admitted Workloads", ".status.admittedWorkloads", "integer", 1),
            _AGE,
        ),
    ),
    Kind(
        KUEUE,
        "v1beta2",
        "LocalQueue",
        "localqueues",
        True,
        ("queue", "queues", "lq"),
        (),
        _STATUS,
        columns=(
            Column("ClusterQueue", ".spec.clusterQueue"),
            Column("Pending Workloads", ".status.pendingWorkloads", "integer"),
            Column("Admitted Workloads", ".status.admittedWorkloads", "integer"),
            _AGE,
        ),
    ),
    Kind(
        KUEUE,
        "v1beta2",
        "Workload",
        "workloads",
        True,
        ("wl",),
        (),
        _STATUS,
        columns=(
            Column("Queue", ".spec.queueName"),
            Column("Reserved in", ".status.admission.clusterQueue"),
            Column("Admitted", ".status.conditions[?type==Admitted].status"),
            Column("Finished", ".status.conditions[?type==Finished].status"),
            _AGE,
        ),
    ),
    Kind(
        KUEUE,
        "v1beta2",
        "WorkloadPriorityClass",
        "workloadpriorityclasses",
        False,
        columns=(Column("Value", ".value", "integer"), _AGE),
    ),
    # last of the Kueue kinds: on Kueue 0.13 it is served at v1alpha1, which must not become the group's
    # preferred version
    Kind(KUEUE, "v1beta2", "Topology", "topologies", False, columns=(_AGE,)),
)

_BY_RESOURCE = {k.resource: k for k in KINDS}


def by_resource(resource: str) -> Kind:
    """The kind stored under a Store resource key such as ``"jobs.batch"`` (keys carry no version)."""
    return _BY_RESOURCE[resource]


class Served:
    """The kinds one API server serves: ``KINDS`` with the Kueue kinds at ``kueue_version`` (None: none
    of them, a cluster without Kueue), their routes and discovery documents.  ``served(version)`` gives
    one per version."""

    def __init__(self, kueue_version: str | None) -> None:
        if kueue_version is not None and kueue_version not in KUEUE_VERSIONS:
            raise ValueError(
                f"kueue_version must be one of {', '.join(KUEUE_VERSIONS)}, got {kueue_version!r}"
            )
        self.kueue_version = kueue_version
        self.kinds = tuple(
            _at_kueue_version(k, kueue_version) for k in KINDS if kueue_version or k.group != KUEUE
        )
        self._by_path = {(k.group, k.version, k.plural): k for k in self.kinds}

    def by_path(self, group: str, version: str, plural: str) -> Kind | None:
        return self._by_path.get((group, version, plural))

    def of(self, resource: str) -> Kind:
        """The served kind of a Store resource key (its ``api_version`` is the one served)."""
        return next(k for k in self.kinds if k.resource == resource)

    def group_versions(self) -> list[tuple[str, str]]:
        """Every served (group, version), core first, in registry order."""
        return list(dict.fromkeys((k.group, k.version) for k in self.kinds))

    def api_group_list(self) -> dict:
        groups: dict[str, list[str]] = {}
        for group, version in self.group_versions():
            if group:
                groups.setdefault(group, []).append(version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self.api_group(name, versions) for name, versions in groups.items()],
        }

    def api_group(self, name: str, versions: list[str] | None = None) -> dict | None:
        """The APIGroup document of group ``name``, or ``None`` when it is not served."""
        versions = versions or [v for g, v in self.group_versions() if g == name]
        if not versions:
            return None
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": name,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def resource_list(self, group: str, version: str) -> dict | None:
        """The APIResourceList of one group version, or ``None`` if it is not served."""
        return _resource_list(
            group, version, [k for k in self.kinds if (k.group, k.version) == (group, version)]
        )


@functools.cache
def served(kueue_version: str | None = KUEUE_VERSIONS[0]) -> Served:
    return Served(kueue_version)


def _at_kueue_version(kind: Kind, version: str) -> Kind:
    """``kind`` as served with Kueue at ``version`` (v1beta1 names the cohort ``spec.cohort``; Kueue 0.13
    serves its ``Topology`` at ``v1alpha1``, 0.14 at ``v1beta1``, 0.15+ at ``v1beta1`` and ``v1beta2``)."""
    if kind.group != KUEUE:
        return kind
    if kind.kind == "Topology" and version == "v1beta1":
        return replace(kind, version="v1alpha1")
    cohort = ".spec.cohortName" if version == "v1beta2" else ".spec.cohort"
    columns = tuple(replace(c, path=cohort) if c.path == ".spec.cohortName" else c for c in kind.columns)
    return replace(kind, version=version, columns=columns)


# ---- discovery documents ---------------------------------------------------------------
_SUBRESOURCE_INFO = {
    # name: (group, version, kind, verbs); group/version None = the parent's
    "status": (None, None, None, ["get", "patch", "update"]),
    "scale": ("autoscaling", "v1", "Scale", ["get", "patch", "update"]),
    "eviction": ("policy", "v1", "Eviction", ["create"]),
    "binding": ("", "v1", "Binding", ["create"]),
    "log": ("", "v1", "Pod", ["get"]),
    "token": ("authentication.k8s.io", "v1", "TokenRequest", ["create"]),
}


def version_info() -> dict:
    major, minor, _ = K8S_VERSION.split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{K8S_VERSION}",
        "gitCommit": "devcluster",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def core_versions() -> dict:
    return {
        "kind": "APIVersions",
        "apiVersion": "v1",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _resource_list(group: str, version: str, kinds: list[Kind]) -> dict | None:
    if not kinds:
        return None
    resources = []
    for k in kinds:
        entry = {
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": k.verbs,
        }
        if k.short_names:
            entry["shortNames"] = list(k.short_names)
        if k.categories:
            entry["categories"] = list(k.categories)
        resources.append(entry)
        for sub in k.subresources:
            sub_group, sub_version, sub_kind, verbs = _SUBRESOURCE_INFO[sub]
            sub_entry = {
                "name": f"{k.plural}/{sub}",
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": sub_kind or k.kind,
                "verbs": verbs,
            }
            if sub_group is not None:
                sub_entry["group"], sub_entry["version"] = sub_group, sub_version
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
