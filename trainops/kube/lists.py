"""Paginated lists: every object a list call matches, ``page_size`` at a time, each page under the retry
policy (``Kube.list`` is the verb; the numbers are ``KubeSettings``').

A list of the whole cluster in one response costs the API server and the caller memory in
proportion to the cluster; pages keep both bounded, as ``kubectl`` (500 per page) does.
A continue token the API server no longer honours (410 Gone: the fleet changed too much meanwhile)
restarts the list from its first page, at most ``list_restarts`` times.
"""

from __future__ import annotations

from collections.abc import Callable

from trainops.errors import TemporaryError
from trainops.kube.retry import DEFAULTS, Deadline, call
from trainops.kube.settings import KubeSettings

PAGE = DEFAULTS.page_size

Fetch = Callable[[str | None], dict]  # a continue token (None first) -> one list response as a dict


def list_all(fetch: Fetch, deadline: Deadline, what: str, settings: KubeSettings = DEFAULTS) -> list[dict]:
    """The items of every page ``fetch`` returns, following ``metadata.continue`` to the end."""
    for _ in range(settings.list_restarts):
        items: list[dict] = []
        token: str | None = None
        try:
            while True:
                page = call(lambda token=token: fetch(token), deadline, what, settings=settings)
                items += page.get("items") or []
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return items
        except Exception as err:
            if token is None or getattr(err, "status", None) != 410:
                raise
    raise TemporaryError(
        f"{what}: the continue token expired {settings.list_restarts} times in a row (the list changes too fast)"
    )
