"""Authentication: who a request is, from its bearer token, as kube-apiserver's authenticators say it.

Two kinds of credential are accepted:

- the devcluster's admin token (the kubeconfig ``DevCluster`` writes), and a request with no
  ``Authorization`` at all, are the admin: ``devcluster-admin`` in ``system:masters`` (RBAC allows
  it everything).  No token being the admin is the devcluster's concession to its own tests and
  tools (a real cluster calls that ``system:anonymous``).
- ServiceAccount tokens issued by the TokenRequest subresource
  (``POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token``, what ``kubectl create token``
  sends): the user ``system:serviceaccount:<ns>:<name>`` in ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``.  A token bound to a Pod or Node
  (``boundObjectRef``) carries the node's name in ``authentication.kubernetes.io/node-name``, as
  Kubernetes 1.30+ does; it stops working when the bound object, or the ServiceAccount, is deleted
  or recreated, and when it expires.

Any other token is 401 ``Unauthorized``.  Tokens are opaque random strings held in memory.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field

from trainops_devcluster.errors import BadRequest, Invalid, Unauthorized
from trainops_devcluster.store import Store

ADMIN_TOKEN = "devcluster-admin-token"
DEFAULT_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
NODE_NAME = "authentication.kubernetes.io/node-name"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
#: TokenRequest's bounds (kube-apiserver: at least 10 minutes; longer requests are capped, not refused)
MIN_EXPIRATION_S, MAX_EXPIRATION_S, DEFAULT_EXPIRATION_S = 600, 2**32, 3600
_BOUND_KINDS = {"Pod": "pods", "Node": "nodes", "Secret": "secrets"}


@dataclass(frozen=True)
class User:
    """``user.Info``: name, groups, extra (values are lists, as in ``userInfo.extra``) and uid (a
    ServiceAccount's)."""

    name: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False)
    uid: str = ""


ADMIN = User("devcluster-admin", ("system:masters", "system:authenticated"))


def service_account_user(
    namespace: str, name: str, extra: dict[str, list[str]] | None = None, uid: str = ""
) -> User:
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
    return User(f"system:serviceaccount:{namespace}:{name}", groups, dict(extra or {}), uid)


@dataclass(frozen=True)
class _Issued:
    user: User
    account: tuple[str, str, str]  # namespace, name, uid
    bound: tuple[str, str, str, str] | None  # resource, namespace, name, uid
    expires: float


class Tokens:
    """Issues ServiceAccount tokens and authenticates requests (thread-safe)."""

    def __init__(self, store: Store, admin_token: str = ADMIN_TOKEN) -> None:
        self.store, self.admin_token = store, admin_token
        self._lock = threading.Lock()
        self._issued: dict[str, _Issued] = {}

    def authenticate(self, authorization: str | None) -> User:
        """The user of an ``Authorization`` header value (``None``: the header is absent)."""
        if authorization is None:
            return ADMIN
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Unauthorized")
        if secrets.compare_digest(token, self.admin_token):
            return ADMIN
        with self._lock:
            issued = self._issued.get(token)
        if issued is None or not self._valid(issued):
            raise Unauthorized("Unauthorized")
        return issued.user

    def _valid(self, issued: _Issued) -> bool:
        if time.time() >= issued.expires:
            return False
        namespace, name, uid = issued.account
        account = self.store.find("serviceaccounts", namespace, name)
        if account is None or account["metadata"]["uid"] != uid:
            return False
        if issued.bound:
            resource, bound_ns, bound_name, bound_uid = issued.bound
            obj = self.store.find(resource, bound_ns, bound_name)
            return obj is not None and obj["metadata"]["uid"] == bound_uid
        return True

    def request(self, namespace: str, name: str, body: dict) -> dict:
        """Answer a TokenRequest for ServiceAccount ``namespace/name``: the request, with its status."""
        account = self.store.get("serviceaccounts", namespace, name)  # 404 when absent
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise BadRequest("a TokenRequest's spec must be an object")
        seconds = spec.get("expirationSeconds") or DEFAULT_EXPIRATION_S
        if not isinstance(seconds, int) or seconds < MIN_EXPIRATION_S:
            raise Invalid(
                "TokenRequest.authentication.k8s.io",
                name,
                [
                    (
                        "spec.expirationSeconds",
                        "FieldValueInvalid",
                        f"Invalid value: {seconds}: may not specify a duration less than 10 minutes",
                    )
                ],
            )
        seconds = min(seconds, MAX_EXPIRATION_S)
        extra: dict[str, list[str]] = {}
        bound = None
        if spec.get("boundObjectRef"):
            bound, extra = self._bind(namespace, name, spec["boundObjectRef"])
        extra[CREDENTIAL_ID] = [f"JTI={uuid.uuid4()}"]  # every ServiceAccount token's (1.30+)
        token = secrets.token_urlsafe(32)
        expires = time.time() + seconds
        issued = _Issued(
            service_account_user(namespace, name, extra, account["metadata"]["uid"]),
            (namespace, name, account["metadata"]["uid"]),
            bound,
            expires,
        )
        with self._lock:
            self._issued[token] = issued
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": {
                "audiences": spec.get("audiences") or [DEFAULT_AUDIENCE],
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {
                "token": token,
                "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
            },
        }

    def _bind(self, namespace: str, account: str, ref: dict) -> tuple[tuple, dict[str, list[str]]]:
        kind, name = ref.get("kind", ""), ref.get("name", "")
        if kind not in _BOUND_KINDS:
            raise Invalid(
                "TokenRequest.authentication.k8s.io",
                account,
                [
                    (
                        "spec.boundObjectRef.kind",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{kind}": supported values: "Node", "Pod", "Secret"',
                    )
                ],
            )
        resource = _BOUND_KINDS[kind]
        bound_ns = "" if kind == "Node" else namespace
        obj = self.store.get(resource, bound_ns, name)
        uid = obj["metadata"]["uid"]
        if ref.get("uid") and ref["uid"] != uid:
            raise BadRequest(
                f"the UID in the bound object reference ({ref['uid']}) does not match the UID in record ({uid})"
            )
        extra: dict[str, list[str]] = {}
        if kind == "Pod":
            extra = {
                "authentication.kubernetes.io/pod-name": [name],
                "authentication.kubernetes.io/pod-uid": [uid],
            }
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                node_obj = self.store.find("nodes", "", node)
                extra[NODE_NAME] = [node]
                if node_obj is not None:
                    extra["authentication.kubernetes.io/node-uid"] = [node_obj["metadata"]["uid"]]
        elif kind == "Node":
            extra = {NODE_NAME: [name], "authentication.kubernetes.io/node-uid": [uid]}
        return (resource, bound_ns, name, uid), extra
