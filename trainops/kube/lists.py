"""Paginated lists: every object a list call matches, ``PAGE`` at a time, each page under the retry policy.

A list of the whole cluster in one response costs the API server and the caller memory in
proportion to the cluster; pages keep both bounded, as ``kubectl`` (500 per page) does.
"""

from __future__ import annotations

from collections.abc import Callable

from trainops.kube.retry import Deadline, call

PAGE = 500

Fetch = Callable[[str | None], dict]  # a continue token (None first) -> one list response as a dict


def list_all(fetch: Fetch, deadline: Deadline, what: str) -> list[dict]:
    """The items of every page ``fetch`` returns, following ``metadata.continue`` to the end."""
    items: list[dict] = []
    token: str | None = None
    while True:
        page = call(lambda token=token: fetch(token), deadline, what)
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
