"""Which of the candidate nodes a claim takes: the ones whose drain disturbs inference least and
waits on no PodDisruptionBudget."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence

from trainops.capacity.drain import must_move
from trainops.capacity.inference import selector_matches


def least_disruptive(
    node_names: Sequence[str],
    pods: Iterable[dict],
    count: int,
    held: Collection[str] = (),
    pdbs: Iterable[dict] = (),
) -> list[str]:
    """``count`` of ``node_names``: nodes held by other runs (``held``) last, then by ``drain_costs``
    (an idle node costs inference nothing), ties by name."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    if len(node_names) < count:
        raise ValueError(
            f"count: {count} node(s) to claim, but only {len(node_names)} candidate(s) given: {list(node_names)}"
        )
    cost = drain_costs(pods, pdbs)
    return sorted(node_names, key=lambda name: (name in held, cost[name], name))[:count]


def drain_costs(pods: Iterable[dict], pdbs: Iterable[dict] = ()) -> Counter:
    """node -> what draining it costs: one per pod a drain must move, and more than all of those
    together per pod whose eviction a PodDisruptionBudget (``pdbs``: the cluster's) refuses now, so
    that a node whose drain would wait for a budget is taken only when no other will do."""
    moving = [pod for pod in pods if must_move(pod)]
    budgets: dict[str, list[dict]] = defaultdict(list)
    for pdb in pdbs:
        budgets[pdb["metadata"].get("namespace", "")].append(pdb)
    refused = len(moving) + 2  # a pod a budget holds costs more than every other pod together
    cost: Counter = Counter()
    for pod in moving:
        node = (pod.get("spec") or {}).get("nodeName")
        cost[node] += refused if _held_by_budget(pod, budgets[pod["metadata"].get("namespace", "")]) else 1
    return cost


def _held_by_budget(pod: dict, pdbs: list[dict]) -> bool:
    """Whether the API server refuses this pod's eviction now: a budget that selects it allows no
    disruption (or has no status yet), or several select it."""
    meta = pod["metadata"]
    if meta.get("deletionTimestamp"):
        return False  # already going
    labels = meta.get("labels") or {}
    selecting = [b for b in pdbs if selector_matches((b.get("spec") or {}).get("selector"), labels)]
    allowed = [(b.get("status") or {}).get("disruptionsAllowed") for b in selecting]
    return len(selecting) > 1 or any(not isinstance(a, int) or a < 1 for a in allowed)
