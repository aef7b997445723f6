"""Optimistic-concurrency edits of any API object: read, change, write guarded by resourceVersion.

``edit`` is the loop every trainops write goes through (nodes, ClusterQueues, inference
workloads).  ``change(obj)`` is a pure function of the object as read: it returns the JSON merge
patch to send, or ``None`` when the object is already as wanted (then nothing is written).  The
patch always carries ``metadata.resourceVersion`` of the object it was computed from, which
the API server treats as a precondition, so a concurrent writer makes it fail with 409
instead of being overwritten; on 409 the object is read again and ``change`` re-applied.
Lists in a merge patch replace the whole list, which is why ``change`` must return whole lists
computed from the object it was given (foreign entries kept).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainops.kube.retry import DEFAULTS, Backoff, Deadline, DeadlineExceeded, call
from trainops.kube.settings import KubeSettings

Read = Callable[[], dict]
Patch = Callable[[dict], dict]
Change = Callable[[dict], dict | None]


@dataclass(frozen=True)
class Edited:
    """The object after the edit, whether this edit wrote it, and the object it was computed from."""

    object: dict
    wrote: bool
    before: dict


def edit(
    read: Read,
    patch: Patch,
    change: Change,
    deadline: Deadline,
    what: str,
    current: dict | None = None,
    settings: KubeSettings = DEFAULTS,
) -> Edited:
    """Apply ``change`` to the object until it sticks; ``current``: an already-read copy (saves one GET).

    ``read()`` returns the object, ``patch(body)`` sends a merge patch and returns the result.
    Transient API errors are retried until ``deadline``; 409 Conflict re-reads and retries, after the
    same backoff (``settings``).
    """
    from kubernetes.client.exceptions import ApiException

    backoff = Backoff(settings)
    obj = current if current is not None else call(read, deadline, f"read {what}", settings=settings)
    while True:
        body = change(obj)
        if body is None:
            return Edited(obj, wrote=False, before=obj)
        body.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
        try:
            written = call(lambda body=body: patch(body), deadline, f"write {what}", settings=settings)
            return Edited(written, wrote=True, before=obj)
        except ApiException as error:
            if error.status != 409:
                raise
            if deadline.expired:
                raise DeadlineExceeded(
                    f"write {what}: conflicting writers for {deadline.seconds:g}s"
                ) from error
            deadline.sleep(backoff.next(), f"write {what}")
            obj = call(read, deadline, f"read {what}", settings=settings)


def merge_patch_of(before: dict, after: dict) -> dict:
    """The JSON merge patch (RFC 7386) that turns ``before`` into ``after`` (lists are replaced whole)."""
    patch: dict = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            nested = merge_patch_of(old, value)
            if nested:
                patch[key] = nested
        elif key not in before or old != value:
            patch[key] = value
    return patch
