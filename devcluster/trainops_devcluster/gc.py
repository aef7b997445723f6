"""Deletion as the API server and the garbage collector do it: preconditions, graceful pod
deletion, finalizers, and the ownerReference cascade (Background, Foreground, Orphan)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainops_devcluster.controller import Controller
from trainops_devcluster.kinds import KINDS, by_resource
from trainops_devcluster.store import DELETED, Conflict, Event, NotFound, Store

FOREGROUND, BACKGROUND, ORPHAN = "Foreground", "Background", "Orphan"
_FINALIZER = {FOREGROUND: "foregroundDeletion", ORPHAN: "orphan"}
_RESOURCES = tuple(k.resource for k in KINDS)
#: batch/v1 Jobs orphan their pods unless told otherwise (kubectl always sends Background)
_DEFAULT_POLICY = {"jobs.batch": ORPHAN}


def delete_object(
    store: Store,
    resource: str,
    namespace: str,
    name: str,
    *,
    propagation: str | None = None,
    grace_seconds: int | None = None,
    resource_version: str | None = None,
    uid: str | None = None,
) -> dict:
    """Delete one object as a DELETE request does.  Returns the object as it is now: gone, or
    marked with ``deletionTimestamp`` while finalizers or a pod's graceful shutdown run."""
    obj = store.get(resource, namespace, name)
    meta = obj["metadata"]
    if uid and uid != meta["uid"]:
        raise Conflict(
            f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: UID in '
            f"precondition: {uid}, UID in object meta: {meta['uid']}",
            resource=resource,
            name=name,
        )
    if resource_version and resource_version != meta["resourceVersion"]:
        raise Conflict(
            f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: ResourceVersion '
            f"in precondition: {resource_version}, ResourceVersion in object meta: {meta['resourceVersion']}",
            resource=resource,
            name=name,
        )
    policy = propagation or _DEFAULT_POLICY.get(resource, BACKGROUND)
    if policy not in (FOREGROUND, BACKGROUND, ORPHAN):
        from trainops_devcluster.errors import BadRequest

        raise BadRequest(
            f"propagationPolicy: Unsupported value: {policy!r}: supported values: Foreground, Background, Orphan"
        )
    finalizers = list(meta.get("finalizers") or [])
    if policy in _FINALIZER and _FINALIZER[policy] not in finalizers and _has_dependents(store, meta["uid"]):
        finalizers.append(_FINALIZER[policy])
    if resource == "namespaces":
        return _mark(store, resource, obj, finalizers, 0, phase="Terminating")
    if resource == "pods" and _graceful(obj, grace_seconds):
        grace = (
            grace_seconds
            if grace_seconds is not None
            else obj["spec"].get("terminationGracePeriodSeconds", 30)
        )
        return _mark(store, resource, obj, finalizers, grace)
    if finalizers:
        return _mark(store, resource, obj, finalizers, 0)
    return store.delete(resource, namespace, name, resource_version=meta["resourceVersion"])


def _graceful(pod: dict, grace_seconds: int | None) -> bool:
    """A pod running on a node is stopped by its kubelet first; others go at once."""
    phase = (pod.get("status") or {}).get("phase")
    return (
        bool(pod.get("spec", {}).get("nodeName"))
        and phase not in ("Succeeded", "Failed")
        and grace_seconds != 0
    )


def _mark(
    store: Store, resource: str, obj: dict, finalizers: list[str], grace: int, phase: str | None = None
) -> dict:
    meta = obj["metadata"]
    deadline = (datetime.now(UTC) + timedelta(seconds=grace)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
        if finalizers == list(meta.get("finalizers") or []):
            return obj
    else:
        meta["deletionTimestamp"] = deadline
        meta["deletionGracePeriodSeconds"] = grace
    if finalizers:
        meta["finalizers"] = finalizers
    if phase:
        obj.setdefault("status", {})["phase"] = phase
    return store.update(resource, obj)


def remove_if_finalized(store: Store, resource: str, obj: dict) -> dict:
    """An object being deleted goes once its last finalizer is removed (pods wait for their kubelet)."""
    meta = obj["metadata"]
    if not meta.get("deletionTimestamp") or meta.get("finalizers") or resource in ("pods", "namespaces"):
        return obj
    try:
        return store.delete(resource, meta.get("namespace", ""), meta["name"])
    except NotFound:
        return obj


def dependents(store: Store, uid: str) -> list[tuple[str, dict]]:
    """Every (resource, object) with an ownerReference to ``uid``."""
    return store.dependents(uid)


def _has_dependents(store: Store, uid: str) -> bool:
    return bool(dependents(store, uid))


def delete_dependents(store: Store, uid: str, policy: str = BACKGROUND) -> int:
    """Cascade from a deleted (or foreground-deleting) owner: delete its dependents, or with
    ``Orphan`` drop their ownerReferences to it.  Returns how many dependents were touched."""
    touched = 0
    for resource, obj in dependents(store, uid):
        meta = obj["metadata"]
        try:
            if policy == ORPHAN:
                store.mutate(resource, meta.get("namespace", ""), meta["name"], lambda o: _drop_owner(o, uid))
            elif not meta.get("deletionTimestamp"):
                delete_object(
                    store, resource, meta.get("namespace", ""), meta["name"], propagation=BACKGROUND
                )
            touched += 1
        except (NotFound, Conflict):
            continue
    return touched


def _drop_owner(obj: dict, uid: str) -> None:
    obj["metadata"]["ownerReferences"] = [
        r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != uid
    ]
    if not obj["metadata"]["ownerReferences"]:
        del obj["metadata"]["ownerReferences"]


class GarbageCollector(Controller):
    """Deletes dependents of deleted owners, finishes Foreground and Orphan deletions, and empties
    terminating namespaces, as kube-controller-manager's garbage collector and namespace controller do."""

    watches = _RESOURCES

    def handle(self, event: Event) -> None:
        obj = event.object
        meta = obj["metadata"]
        if event.type == DELETED:
            delete_dependents(self.store, meta["uid"], BACKGROUND)
            for ref in meta.get("ownerReferences") or ():
                self._finish_foreground(ref, meta.get("namespace", ""))
            if meta.get("namespace"):
                self._finish_namespace(meta["namespace"])
            return
        if not meta.get("deletionTimestamp"):
            return
        if event.resource == "namespaces":
            self._empty_namespace(meta["name"])
        elif "orphan" in (meta.get("finalizers") or ()):
            delete_dependents(self.store, meta["uid"], ORPHAN)
            self._remove_finalizer(event.resource, obj, "orphan")
        elif "foregroundDeletion" in (meta.get("finalizers") or ()):
            delete_dependents(self.store, meta["uid"], BACKGROUND)
            self._finish_foreground_of(event.resource, obj)

    def _finish_foreground(self, ref: dict, namespace: str) -> None:
        """The owner named by ``ref`` (in the dependent's namespace, unless cluster-scoped) may be waiting
        in Foreground deletion for its last dependent to go."""
        for resource in _RESOURCES:
            kind = by_resource(resource)
            if kind.kind != ref.get("kind") or kind.api_version != ref.get("apiVersion"):
                continue
            owner = self.store.find(resource, namespace if kind.namespaced else "", ref.get("name", ""))
            if owner and owner["metadata"]["uid"] == ref.get("uid"):
                self._finish_foreground_of(resource, owner)

    def _finish_foreground_of(self, resource: str, owner: dict) -> None:
        if "foregroundDeletion" in (owner["metadata"].get("finalizers") or ()) and not dependents(
            self.store, owner["metadata"]["uid"]
        ):
            self._remove_finalizer(resource, owner, "foregroundDeletion")

    def _remove_finalizer(self, resource: str, obj: dict, finalizer: str) -> None:
        meta = obj["metadata"]

        def drop(o: dict) -> None:
            o["metadata"]["finalizers"] = [f for f in o["metadata"].get("finalizers") or () if f != finalizer]

        try:
            updated = self.store.mutate(resource, meta.get("namespace", ""), meta["name"], drop)
        except NotFound:
            return
        remove_if_finalized(self.store, resource, updated)

    def _empty_namespace(self, namespace: str) -> None:
        for resource in _RESOURCES:
            if not by_resource(resource).namespaced:
                continue
            for obj in self.store.list(resource, namespace)[0]:
                if not obj["metadata"].get("deletionTimestamp"):
                    try:
                        delete_object(
                            self.store, resource, namespace, obj["metadata"]["name"], propagation=BACKGROUND
                        )
                    except (NotFound, Conflict):
                        continue
        self._finish_namespace(namespace)

    def _finish_namespace(self, namespace: str) -> None:
        ns = self.store.find("namespaces", "", namespace)
        if not ns or not ns["metadata"].get("deletionTimestamp"):
            return
        if any(self.store.list(r, namespace)[0] for r in _RESOURCES if by_resource(r).namespaced):
            return
        try:
            self.store.delete("namespaces", "", namespace)
        except NotFound:
            pass
