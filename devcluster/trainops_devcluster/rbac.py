"""Authorization: kube-apiserver's request attributes and its RBAC authorizer over the stored
Roles, ClusterRoles, RoleBindings and ClusterRoleBindings, plus SelfSubjectAccessReview.

``attributes`` reads a request as ``RequestInfoFactory`` does (verb, namespace, API group, resource,
subresource, name; or a non-resource path).  ``Authorizer.allowed_by`` answers as the RBAC
authorizer does, after the privileged-group authorizer that lets ``system:masters`` do anything:
a ClusterRoleBinding's rules apply everywhere, a RoleBinding's (to a Role or a ClusterRole) only in
its namespace; rules match on API group, resource (``pods/log``, ``*``, ``*/status``), verb (``*``),
``resourceNames`` and ``nonResourceURLs`` (``/apis/*``).  Aggregated ClusterRoles
(``aggregationRule``) are not computed.  ``BOOTSTRAP`` is the part of the default policy every
cluster starts with that the devcluster needs: ``cluster-admin`` and discovery for every
authenticated user (``system:discovery``, ``system:basic-user``, ``system:public-info-viewer``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainops_devcluster.authn import User
from trainops_devcluster.errors import BadRequest, Forbidden
from trainops_devcluster.selectors import BadSelector, field_terms
from trainops_devcluster.store import Store

GROUP = "rbac.authorization.k8s.io"
_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclass(frozen=True)
class Attributes:
    """``authorizer.Attributes`` of one request (``path`` only for a non-resource request)."""

    verb: str
    resource_request: bool = True
    namespace: str = ""
    group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def attributes(method: str, path: str, query: dict[str, str]) -> Attributes:
    """The attributes kube-apiserver's ``RequestInfoFactory`` derives from a request."""
    verb = _VERBS.get(method, method.lower())
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(method.lower(), resource_request=False, path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "").lower() in ("1", "true") else "list"
        selected = _exact_name(query.get("fieldSelector", ""))
        name = selected or name
    elif not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, True, namespace, group, resource, subresource, name)


def _exact_name(selector: str) -> str:
    """The name a list or watch's field selector requires (``metadata.name=x`` or ``==x``), as
    ``RequestInfoFactory`` reads it; ``""`` for none or a malformed selector."""
    try:
        terms = field_terms(selector) if selector else []
    except BadSelector:
        return ""
    return next((value for path, equals, value in terms if path == "metadata.name" and equals), "")


class Authorizer:
    """RBAC over the objects in ``store``, evaluated at each request (no cache to go stale)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def allowed_by(self, user: User, attrs: Attributes) -> str | None:
        """Why ``user`` may do ``attrs`` (the RBAC reason), or ``None`` if it may not."""
        if "system:masters" in user.groups:
            return "allowed by the system:masters group"
        for source, rules in self._rules(user, attrs.namespace if attrs.resource_request else ""):
            if any(_rule_allows(rule, attrs) for rule in rules):
                return f"RBAC: allowed by {source}"
        return None

    def _rules(self, user: User, namespace: str) -> Iterator[tuple[str, list[dict]]]:
        for binding in self.store.list(f"clusterrolebindings.{GROUP}")[0]:
            subject = _subject_of(binding, user, "")
            if subject:
                ref = binding.get("roleRef") or {}
                name = binding["metadata"]["name"]
                yield (
                    f'ClusterRoleBinding "{name}" of {ref.get("kind")} "{ref.get("name")}" to {subject}',
                    self._role_rules(ref, ""),
                )
        if not namespace:
            return
        for binding in self.store.list(f"rolebindings.{GROUP}", namespace)[0]:
            subject = _subject_of(binding, user, namespace)
            if subject:
                ref = binding.get("roleRef") or {}
                name = f"{binding['metadata']['name']}/{namespace}"
                yield (
                    f'RoleBinding "{name}" of {ref.get("kind")} "{ref.get("name")}" to {subject}',
                    self._role_rules(ref, namespace),
                )

    def _role_rules(self, ref: dict, namespace: str) -> list[dict]:
        if ref.get("kind") == "ClusterRole":
            role = self.store.find(f"clusterroles.{GROUP}", "", ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = self.store.find(f"roles.{GROUP}", namespace, ref.get("name", ""))
        else:
            role = None
        return [r for r in (role or {}).get("rules") or [] if isinstance(r, dict)]


def _subject_of(binding: dict, user: User, namespace: str) -> str | None:
    """The subject of ``binding`` that is ``user``, described as RBAC's reasons do, or ``None``."""
    for s in binding.get("subjects") or []:
        kind, name = s.get("kind"), s.get("name", "")
        if kind == "ServiceAccount":
            ns = s.get("namespace") or namespace
            if ns and user.name == f"system:serviceaccount:{ns}:{name}":
                return f'ServiceAccount "{name}/{ns}"'
        elif (kind == "User" and user.name == name) or (kind == "Group" and name in user.groups):
            return f'{kind} "{name}"'
    return None


def _rule_allows(rule: dict, attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return any(
            url == "*" or url == attrs.path or (url.endswith("*") and attrs.path.startswith(url[:-1]))
            for url in rule.get("nonResourceURLs") or []
        )
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    resources = rule.get("resources") or []
    wanted = attrs.resource_path
    if not any(
        r in ("*", wanted) or (attrs.subresource and r == f"*/{attrs.subresource}") for r in resources
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def forbidden(user: User, attrs: Attributes) -> Forbidden:
    """The 403 kube-apiserver answers when no authorizer allows ``attrs``."""
    if not attrs.resource_request:
        return Forbidden(f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"')
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    why = (
        f'User "{user.name}" cannot {attrs.verb} resource "{attrs.resource_path}" in API group '
        f'"{attrs.group}" {scope}'
    )
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    named = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    return Forbidden(f"{named} is forbidden: {why}", resource=qualified, name=attrs.name)


# ---- SelfSubjectAccessReview ---------------------------------------------------------------
REVIEW_GROUP, REVIEW_VERSION = "authorization.k8s.io", "v1"
REVIEW_PATH = f"/apis/{REVIEW_GROUP}/{REVIEW_VERSION}/selfsubjectaccessreviews"


def self_subject_access_review(authorizer: Authorizer, user: User, review: dict) -> dict:
    """Answer a SelfSubjectAccessReview: may ``user`` do what its spec describes?"""
    spec = review.get("spec") if isinstance(review, dict) else None
    if not isinstance(spec, dict):
        raise BadRequest("a SelfSubjectAccessReview needs a spec")
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if bool(res) == bool(non):
        raise BadRequest("exactly one of nonResourceAttributes or resourceAttributes must be specified")
    if res:
        attrs = Attributes(
            verb=res.get("verb", ""),
            namespace=res.get("namespace", ""),
            group=res.get("group", ""),
            resource=res.get("resource", ""),
            subresource=res.get("subresource", ""),
            name=res.get("name", ""),
        )
    else:
        attrs = Attributes(verb=non.get("verb", ""), resource_request=False, path=non.get("path", ""))
    reason = authorizer.allowed_by(user, attrs)
    status = {"allowed": reason is not None}
    if reason:
        status["reason"] = reason
    meta = dict(review.get("metadata") or {})
    meta.setdefault("creationTimestamp", None)
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": f"{REVIEW_GROUP}/{REVIEW_VERSION}",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


# ---- the default policy --------------------------------------------------------------------
_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                   "/readyz", "/version", "/version/"]  # fmt: skip
_PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
_SELF_REVIEWS = ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]


def _cluster_role(name: str, rules: list[dict]) -> dict:
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    return {"metadata": {"name": name, "labels": labels}, "rules": rules}


def _binding_to_groups(name: str, groups: list[str]) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": g} for g in groups],
    }


BOOTSTRAP: tuple[tuple[str, dict], ...] = (
    (
        f"clusterroles.{GROUP}",
        _cluster_role(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
    ),
    (
        f"clusterroles.{GROUP}",
        _cluster_role("system:discovery", [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}]),
    ),
    (
        f"clusterroles.{GROUP}",
        _cluster_role(
            "system:basic-user",
            [{"apiGroups": ["authorization.k8s.io"], "resources": _SELF_REVIEWS, "verbs": ["create"]}],
        ),
    ),
    (
        f"clusterroles.{GROUP}",
        _cluster_role(
            "system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_INFO_URLS, "verbs": ["get"]}]
        ),
    ),
    (f"clusterrolebindings.{GROUP}", _binding_to_groups("cluster-admin", ["system:masters"])),
    (f"clusterrolebindings.{GROUP}", _binding_to_groups("system:discovery", ["system:authenticated"])),
    (f"clusterrolebindings.{GROUP}", _binding_to_groups("system:basic-user", ["system:authenticated"])),
    (
        f"clusterrolebindings.{GROUP}",
        _binding_to_groups("system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]),
    ),
)
