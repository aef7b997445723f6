"""ClusterQueue quota arithmetic for the simulated Kueue: quantities, pod requests and flavor assignment.

Quota is nominal, as in Kueue without TAS: nodes are never looked at.  A Workload fits when, for every
resource its pods request, one flavor of the resource group covering that resource has
``nominalQuota - usage`` left for the whole PodSet (pod requests x count): all or nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

Usage = Counter  # (flavor, resource) -> Decimal


class QuotaError(ValueError):
    """A ClusterQueue field that is not a valid quota."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def parse_quantity(value: object) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity as parse

    return parse(value)


def format_quantity(value: Decimal) -> str:
    """A canonical-looking Kubernetes quantity: ``8``, ``500m``, ``64Gi``."""
    if value == value.to_integral_value():
        number = int(value)
        for suffix, factor in (("Gi", 2**30), ("Mi", 2**20)):
            if number and number % factor == 0:
                return f"{number // factor}{suffix}"
        return str(number)
    return f"{int(value * 1000)}m" if (value * 1000) == (value * 1000).to_integral_value() else str(value)


def pod_requests(pod_spec: dict) -> dict[str, Decimal]:
    """Effective requests of one pod: containers summed, init containers as a maximum; a limit stands
    in for a missing request, as the API server defaults it."""

    def requests(container: dict) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(value) for name, value in merged.items()}

    total: Counter = Counter()
    for container in pod_spec.get("containers", []):
        total.update(requests(container))
    for container in pod_spec.get("initContainers", []):
        for name, value in requests(container).items():
            total[name] = max(total[name], value)
    return {name: value for name, value in total.items() if value > 0}


@dataclass(frozen=True)
class Flavor:
    name: str
    nominal: dict[str, Decimal]


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[Flavor, ...]


def resource_groups(cluster_queue: dict) -> list[ResourceGroup]:
    """The ClusterQueue's ``spec.resourceGroups``, parsed; ``QuotaError`` names a bad field."""
    groups = []
    for g, group in enumerate(cluster_queue.get("spec", {}).get("resourceGroups") or []):
        covered = list(group.get("coveredResources") or [])
        flavors = []
        for f, flavor in enumerate(group.get("flavors") or []):
            nominal = {}
            resources = flavor.get("resources") or []
            if len(resources) != len(covered):  # Kueue's CRD rule and its message
                raise QuotaError(
                    f"spec.resourceGroups[{g}]",
                    'Invalid value: "object": flavors must have the same number of resources as the '
                    "coveredResources",
                )
            for r, resource in enumerate(resources):
                if resource.get("name") != covered[r]:  # Kueue's webhook: in coveredResources' order
                    raise QuotaError(
                        f"spec.resourceGroups[{g}].flavors[{f}].resources[{r}].name",
                        f'Invalid value: "{resource.get("name")}": must match the name in coveredResources',
                    )
                path = f"spec.resourceGroups[{g}].flavors[{f}].resources[{r}].nominalQuota"
                try:
                    nominal[resource["name"]] = parse_quantity(resource.get("nominalQuota"))
                except (ValueError, TypeError, KeyError, ArithmeticError):
                    raise QuotaError(
                        path,
                        f"Invalid value: {resource.get('nominalQuota')!r}: must be a quantity such as "
                        "8, 500m or 64Gi (and the resource needs a name)",
                    ) from None
            flavors.append(Flavor(flavor.get("name", ""), nominal))
        groups.append(ResourceGroup(tuple(covered), tuple(flavors)))
    return groups


def flavor_names(groups: list[ResourceGroup]) -> list[str]:
    return list(dict.fromkeys(flavor.name for group in groups for flavor in group.flavors))


@dataclass
class Fit:
    """The outcome of fitting a Workload: ``assignments`` when it fits, else a pending reason."""

    assignments: list[dict] | None = None
    usage: Usage = field(default_factory=Counter)
    reason: str = ""
    message: str = ""

    @property
    def fits(self) -> bool:
        return self.assignments is not None


def fit_workload(workload: dict, groups: list[ResourceGroup], usage: Usage, node_labels: dict) -> Fit:
    """Assign a flavor per PodSet and resource group against free quota ``nominal - usage``.

    ``node_labels`` maps a flavor name to its ``spec.nodeLabels``; a flavor whose labels contradict
    the pod's nodeSelector is skipped, as Kueue's flavor assigner does."""
    fit = Fit(assignments=[])
    for podset in workload["spec"].get("podSets", []):
        count = int(podset.get("count", 1))
        spec = podset.get("template", {}).get("spec", {})
        per_pod = pod_requests(spec)
        total = {name: value * count for name, value in per_pod.items()}
        covered = {name for group in groups for name in group.covered}
        uncovered = sorted(set(total) - covered)
        if uncovered:  # said first, whatever else does not fit (as Kueue 0.13 does)
            return Fit(
                reason="NoMatchingFlavor",
                message=f"couldn't assign flavors to pod set {podset['name']}: resource {uncovered[0]} "
                "unavailable in ClusterQueue",
            )
        flavors: dict[str, str] = {}
        for group in groups:
            wanted = {name: value for name, value in total.items() if name in group.covered}
            if not wanted:
                continue
            choice, why = _choose_flavor(
                group, wanted, usage + fit.usage, fit.usage, spec.get("nodeSelector") or {}, node_labels
            )
            if choice is None:
                return Fit(
                    reason=why[0], message=f"couldn't assign flavors to pod set {podset['name']}: {why[1]}"
                )
            for name, value in wanted.items():
                flavors[name] = choice
                fit.usage[(choice, name)] += value
        fit.assignments.append(
            {
                "name": podset["name"],
                "flavors": flavors,
                "resourceUsage": {name: format_quantity(value) for name, value in total.items()},
                "count": count,
            }
        )
    return fit


def _choose_flavor(
    group: ResourceGroup, wanted: dict, usage: Usage, previous: Usage, node_selector: dict, node_labels: dict
) -> tuple[str | None, tuple[str, str]]:
    """The first flavor of ``group`` with room for ``wanted`` (``usage``: the queue's, with the
    Workload's earlier PodSets, which are ``previous``), or why none has (Kueue's flavor assigner's words)."""
    reasons = []
    for flavor in group.flavors:
        labels = node_labels.get(flavor.name) or {}
        clash = next(
            (key for key in labels if key in node_selector and node_selector[key] != labels[key]), None
        )
        if clash:
            reasons.append(("NoMatchingFlavor", f"flavor {flavor.name} doesn't match node affinity"))
            continue
        for name, value in wanted.items():
            nominal = flavor.nominal.get(name)
            if nominal is None:
                reasons.append(("NoMatchingFlavor", f"resource {name} unavailable in flavor {flavor.name}"))
                break
            before = Decimal(previous[(flavor.name, name)])
            if before + value > nominal:
                reasons.append(
                    (
                        "ExceedsMaxQuota",
                        f"insufficient quota for {name} in flavor {flavor.name}, previously considered podsets "
                        f"requests ({format_quantity(before)}) + current podset request ({format_quantity(value)}) "
                        f"> maximum capacity ({format_quantity(nominal)})",
                    )
                )
                break
            missing = value - (nominal - usage[(flavor.name, name)])
            if missing > 0:
                reasons.append(
                    (
                        "WaitingForQuota",
                        f"insufficient unused quota for {name} in flavor {flavor.name}, "
                        f"{format_quantity(missing)} more needed",
                    )
                )
                break
        else:
            return flavor.name, ("", "")
    if not reasons:
        return None, ("NoMatchingFlavor", f"no flavor covers {', '.join(sorted(wanted))}")
    # the most hopeful reason wins: waiting for quota beats a permanent misfit; the message lists every
    # flavor's reason, sorted and joined with ", " (Kueue's flavorassigner Status.Message)
    order = {"WaitingForQuota": 0, "ExceedsMaxQuota": 1, "NoMatchingFlavor": 2}
    best = min(reasons, key=lambda item: order[item[0]])
    return None, (best[0], ", ".join(sorted(message for _, message in reasons)))
