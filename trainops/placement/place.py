"""The placement itself, pure: ``place(slots, count, request, spares)``.

A ``Slot`` is a node that could take the run's pods: its labels, how many pods it can take now
(``free``: 0 for a node that is busy, held or unhealthy) and what taking it disturbs (``cost``: the
inference pods a drain must move; lower is taken first).  The nodes form a tree by the request's
levels (a domain is the path of label values from the widest level down, so two racks of the same
name in different blocks are different racks); a node without every level label is left out, as
Kueue leaves it out.

The choice is Kueue's "BestFit" for Topology Aware Scheduling (``pkg/cache/scheduler/
tas_flavor_snapshot.go``): at the requested level, the domain with the least free capacity that
still holds every pod; none holds them: ``required`` fails naming the largest, ``preferred`` tries
the level above, and at the widest level takes the domains with the most free capacity first (the
fewest domains that hold the run) and the best fit for the last.  Inside the chosen domains it goes
down level by level the same way, so a run also spans the fewest racks it can.  Spares go with the
run: into the run's own domain when one domain of the requested level holds run and spares, else to
the free nodes nearest the run (sharing its rack, then its block...), least disruptive first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainops.placement.request import HOSTNAME_LABEL, TopologyRequest

MAX_LISTED = 6  # domains named in a reason


@dataclass(frozen=True)
class Slot:
    """A node a run could take (see the module docstring)."""

    name: str
    labels: Mapping[str, str]
    free: int = 1
    cost: float = 0.0


@dataclass
class Placement:
    """Where the run's pods go (``pods``: node -> pods), its ``spares``, and how it came out.

    ``fits``: False when the request cannot be met now (``reason`` says why and what the largest
    domains hold).  ``level``: the narrowest level one domain of which holds the whole run (None:
    spread over several domains of the widest level, or no topology asked).  ``domains``: per level,
    the domains the run and its spares use, each named by its path (``block-a/rack-03``)."""

    request: TopologyRequest
    count: int
    pods: dict[str, int] = field(default_factory=dict)
    spares: list[str] = field(default_factory=list)
    fits: bool = False
    level: str | None = None
    reason: str = ""
    domains: dict[str, list[str]] = field(default_factory=dict)

    @property
    def run(self) -> list[str]:
        return sorted(self.pods)

    @property
    def nodes(self) -> list[str]:
        """Every node to claim: the run's, then its spares."""
        return self.run + self.spares

    def spans(self, level: str) -> int:
        """How many domains of ``level`` the run's pods use."""
        return len(self.run_domains(level))

    def run_domains(self, level: str) -> list[str]:
        return _domain_names(self.request.levels, level, self._labels, self.run)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": self.request.to_dict(),
            "fits": self.fits,
            "level": self.level,
            "reason": self.reason,
            "run": self.run,
            "spares": self.spares,
            "domains": self.domains,
        }

    _labels: dict[str, Mapping[str, str]] = field(default_factory=dict, repr=False)


@dataclass
class _Domain:
    path: tuple[str, ...]
    children: list[_Domain] = field(default_factory=list)
    slot: Slot | None = None  # leaves: the node
    free: int = 0
    cost: float = 0.0

    @property
    def name(self) -> str:
        return "/".join(self.path)


def place(slots: Iterable[Slot], count: int, request: TopologyRequest, spares: int = 0) -> Placement:
    """Place ``count`` pods (one per node where ``free`` is 1) and ``spares`` spare nodes; see the
    module docstring.  With no topology (``request.mode == "none"``) the least disruptive nodes win."""
    for name, value in (("count", count), ("spares", spares)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "count" else 0):
            raise ValueError(f"{name} must be an integer >= {1 if name == 'count' else 0}, got {value!r}")
    slots = [s for s in slots if s.free > 0]
    labels = {s.name: s.labels for s in slots}
    if not request.active:
        return _least_disruptive(slots, count, request, spares, labels)
    placed, unlabelled = _tree(slots, request.levels)
    result = Placement(request, count, _labels=labels)
    wanted = _level_index(request)
    chosen = None
    if spares:  # run and spares together: in one domain of the level, else (preferred) as few as hold them
        chosen, _ = _fit(placed, wanted, count + spares, required=True)
        if chosen is None and not request.required:
            chosen, _ = _fit(placed, wanted, count + spares, required=False)
    if chosen is not None:  # the run itself as tight as it goes among them
        result.pods = place([leaf.slot for leaf, _ in _descend(chosen)], count, request).pods
    else:
        chosen, _ = _fit(placed, wanted, count, required=request.required)
        if chosen is None:
            result.reason = _why_not(placed, wanted, count, request, unlabelled)
            return result
        result.pods = _consume(_descend(chosen))
    result.spares = _nearest(placed[-1], result.pods, spares)
    if len(result.spares) < spares:
        result.reason = f"only {len(result.spares)} of {spares} spare node(s) free; "
    result.fits = True
    result.level = next((level for level in reversed(request.levels) if result.spans(level) == 1), None)
    result.domains = domains_of(request.levels, labels, result.nodes)
    result.reason += _how(result, request, placed[wanted])
    return result


def domains_of(
    levels: Sequence[str], labels: Mapping[str, Mapping[str, str]], nodes: Iterable[str]
) -> dict[str, list[str]]:
    """Per level but the hostname, the domains ``nodes`` sit in (``labels``: node -> its labels), each
    named by its path (``block-a/rack-2``); a missing label reads ``?``."""
    nodes = list(nodes)
    return {level: _domain_names(levels, level, labels, nodes) for level in levels if level != HOSTNAME_LABEL}


# ---- the tree ----------------------------------------------------------------------------------
def _internal_levels(levels: Sequence[str]) -> list[str]:
    """The levels above the node itself (the node is always the last, hostname or not)."""
    return [level for level in levels if level != HOSTNAME_LABEL]


def _level_index(request: TopologyRequest) -> int:
    internal = _internal_levels(request.levels)
    return len(internal) if request.level == HOSTNAME_LABEL else internal.index(request.level)


def _level_name(request: TopologyRequest, index: int) -> str:
    internal = _internal_levels(request.levels)
    return internal[index] if index < len(internal) else HOSTNAME_LABEL


def _tree(slots: list[Slot], levels: Sequence[str]) -> tuple[list[list[_Domain]], list[tuple[str, str]]]:
    """Domains per level (widest first, nodes last), and the nodes left out with the label they lack."""
    internal = _internal_levels(levels)
    per_level: list[dict[tuple[str, ...], _Domain]] = [{} for _ in range(len(internal) + 1)]
    unlabelled = []
    for slot in sorted(slots, key=lambda s: s.name):
        missing = next((level for level in levels if not slot.labels.get(level)), None)
        if missing:
            unlabelled.append((slot.name, missing))
            continue
        path = tuple(slot.labels[level] for level in internal) + (slot.name,)
        parent = None
        for depth in range(len(path)):
            key = path[: depth + 1]
            domain = per_level[depth].get(key)
            if domain is None:
                domain = per_level[depth][key] = _Domain(key)
                if parent is not None:
                    parent.children.append(domain)
            domain.free += slot.free
            domain.cost += slot.cost
            parent = domain
        parent.slot = slot
    return [list(level.values()) for level in per_level], unlabelled


def _sorted(domains: Iterable[_Domain]) -> list[_Domain]:
    """Most free capacity first, then the least disruptive, then by name (Kueue: capacity, then name)."""
    return sorted(domains, key=lambda d: (-d.free, d.cost, d.path))


def _best_fit(domains: list[_Domain], needed: int) -> _Domain:
    """The first of the domains with the least free capacity that still holds ``needed``."""
    fitting = [d for d in domains if d.free >= needed]
    return min(fitting, key=lambda d: d.free) if fitting else domains[0]


def _take_minimum(domains: list[_Domain], needed: int) -> tuple[list[tuple[_Domain, int]], int]:
    """The fewest of ``domains`` (sorted) that hold ``needed``: largest first, the best fit for the
    last; returns (domain, pods) pairs and what is still missing."""
    taken = []
    for i, domain in enumerate(domains):
        if domain.free >= needed:
            taken.append((_best_fit(domains[i:], needed), needed))
            return taken, 0
        if domain.free > 0:
            taken.append((domain, domain.free))
            needed -= domain.free
    return taken, needed


def _fit(
    placed: list[list[_Domain]], index: int, count: int, *, required: bool
) -> tuple[list[tuple[_Domain, int]] | None, int | None]:
    """The domains at ``index`` or above that hold ``count`` pods, and the level index where one
    domain holds them all (None: spread over the widest level)."""
    domains = _sorted(placed[index])
    if domains and domains[0].free >= count:
        return [(_best_fit(domains, count), count)], index
    if required:
        return None, None
    if index > 0:
        return _fit(placed, index - 1, count, required=False)
    taken, missing = _take_minimum(domains, count)
    return (None, None) if missing else (taken, None)


def _descend(chosen: list[tuple[_Domain, int]]) -> list[tuple[_Domain, int]]:
    """Down to the nodes, level by level, the fewest child domains each time."""
    result = []
    for domain, pods in chosen:
        if not domain.children:
            result.append((domain, pods))
            continue
        taken, _ = _take_minimum(_sorted(domain.children), pods)
        result += _descend(taken)
    return result


def _consume(leaves: list[tuple[_Domain, int]]) -> dict[str, int]:
    """node -> pods, from the chosen leaves."""
    pods: dict[str, int] = {}
    for leaf, count in leaves:
        pods[leaf.slot.name] = pods.get(leaf.slot.name, 0) + count
    return pods


def _nearest(nodes: list[_Domain], used: Mapping[str, int], spares: int) -> list[str]:
    """``spares`` free nodes the run does not use, those sharing the longest path with a run node
    first (its rack, then its block...), then the least disruptive, then by name."""
    run_paths = [n.path for n in nodes if n.slot.name in used]

    def distance(node: _Domain) -> int:
        shared = max((_common(node.path, path) for path in run_paths), default=0)
        return len(node.path) - shared

    free = [n for n in nodes if n.slot.name not in used]
    return [n.slot.name for n in sorted(free, key=lambda n: (distance(n), n.slot.cost, n.path))[:spares]]


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


# ---- words -------------------------------------------------------------------------------------
def _domain_names(
    levels: Sequence[str], level: str, labels: Mapping[str, Mapping[str, str]], nodes: Iterable[str]
) -> list[str]:
    """The domains of ``level`` that ``nodes`` sit in, named by their path."""
    upto = list(levels[: list(levels).index(level) + 1])
    names = {"/".join(labels[node].get(key, "?") for key in upto) for node in nodes if node in labels}
    return sorted(names)


def _largest(domains: list[_Domain]) -> str:
    ranked = [d for d in _sorted(domains) if d.free > 0][:MAX_LISTED]
    more = len([d for d in domains if d.free > 0]) - len(ranked)
    listed = ", ".join(f"{d.name} {d.free}" for d in ranked) or "none"
    return listed + (f" and {more} more" if more > 0 else "")


def _why_not(
    placed: list[list[_Domain]],
    index: int,
    count: int,
    request: TopologyRequest,
    unlabelled: list[tuple[str, str]],
) -> str:
    level = _level_name(request, index)
    total = sum(d.free for d in placed[0])
    if request.required and total >= count:
        reason = (
            f"no {level} domain holds {count} free node(s) (required); the largest hold: "
            f"{_largest(placed[index])}"
        )
    else:
        reason = f"only {total} free node(s) carry the topology labels, {count} needed"
    if unlabelled:
        name, label = unlabelled[0]
        reason += (
            f"; {len(unlabelled)} free node(s) lack a topology label and are left out "
            f"(e.g. {name} has no {label})"
        )
    return reason


def _how(result: Placement, request: TopologyRequest, asked_domains: list[_Domain]) -> str:
    asked, top = request.level, request.levels[0]
    where = "; ".join(f"{level}: {', '.join(names)}" for level, names in result.domains.items())
    if result.spans(asked) == 1:
        how = f"{result.count} node(s) in one {asked} domain"
    elif result.level is not None:
        how = (
            f"no {asked} domain holds {result.count} free node(s) (largest: {_largest(asked_domains)}); "
            f"placed in one {result.level} domain instead"
        )
    else:
        how = (
            f"no {top} domain holds {result.count} free node(s); spread over {result.spans(top)} {top} "
            "domain(s), the fewest that hold them"
        )
    ref = asked if result.spans(asked) == 1 else result.level  # the run's domain, named by its level
    home = result.run_domains(ref) if ref else []
    outside = [n for n in result.spares if ref and _domain_of(result, ref, n) not in home]
    spare_note = f"; spares {', '.join(result.spares)}" if result.spares else ""
    if outside:
        spare_note += f" ({len(outside)} outside the run's {ref} domain)"
    return f"{how} ({where}){spare_note}"


def _domain_of(result: Placement, level: str, node: str) -> str:
    return _domain_names(result.request.levels, level, result._labels, [node])[0]


def _least_disruptive(
    slots: list[Slot], count: int, request: TopologyRequest, spares: int, labels: Mapping
) -> Placement:
    ranked = [s.name for s in sorted(slots, key=lambda s: (s.cost, s.name))]
    result = Placement(request, count, _labels=labels)
    if len(ranked) < count:
        result.reason = f"only {len(ranked)} free node(s), {count} needed"
        return result
    result.pods = dict.fromkeys(ranked[:count], 1)
    result.spares = ranked[count : count + spares]
    result.fits = True
    result.domains = domains_of(request.levels, labels, result.nodes)
    result.reason = "no topology asked: the least disruptive nodes"
    return result
