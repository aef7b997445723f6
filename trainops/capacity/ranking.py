"""Which of the candidate nodes a claim takes: the ones whose drain disturbs inference least."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from trainops.capacity.drain import must_move


def least_disruptive(
    node_names: Sequence[str], pods: Iterable[dict], count: int, held: Collection[str] = ()
) -> list[str]:
    """``count`` of ``node_names``: nodes held by other runs (``held``) last, then those running the
    fewest pods a drain must move (an idle node costs inference nothing), ties by name."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    if len(node_names) < count:
        raise ValueError(
            f"count: {count} node(s) to claim, but only {len(node_names)} candidate(s) given: {list(node_names)}"
        )
    busy = Counter((pod.get("spec") or {}).get("nodeName") for pod in pods if must_move(pod))
    return sorted(node_names, key=lambda name: (name in held, busy[name], name))[:count]
