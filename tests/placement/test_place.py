"""The pure placement on fleets of several shapes (plain data): blocks spanned against the optimum,
required vs preferred, spares beside the run, nodes without labels, the least disruptive within."""

from __future__ import annotations

import itertools
import random

import pytest

from trainops.placement.place import Slot, place
from trainops.placement.request import (
    BLOCK_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
    TopologyRequest,
)

BLOCK, RACK = BLOCK_LABEL, RACK_LABEL


def fleet(
    shape: dict[str, dict[str, int]], busy: set[str] = frozenset(), cost: dict | None = None
) -> list[Slot]:
    """``{block: {rack: nodes}}`` -> slots named ``<block>-<rack>-<i>``; ``busy`` nodes have free 0."""
    slots = []
    for block, racks in shape.items():
        for rack, count in racks.items():
            for i in range(count):
                name = f"{block}-{rack}-{i}"
                labels = {BLOCK: block, RACK: rack, HOSTNAME_LABEL: name}
                slots.append(Slot(name, labels, 0 if name in busy else 1, (cost or {}).get(name, 0.0)))
    return slots


def blocks_of(nodes, slots) -> set[str]:
    labels = {s.name: s.labels for s in slots}
    return {labels[n][BLOCK] for n in nodes}


def racks_of(nodes, slots) -> set[tuple[str, str]]:
    labels = {s.name: s.labels for s in slots}
    return {(labels[n][BLOCK], labels[n][RACK]) for n in nodes}


def optimum_blocks(slots, count) -> int:
    """The fewest blocks whose free nodes hold ``count`` (brute force over block subsets)."""
    free: dict[str, int] = {}
    for s in slots:
        free[s.labels[BLOCK]] = free.get(s.labels[BLOCK], 0) + s.free
    for k in range(1, len(free) + 1):
        if any(sum(free[b] for b in combo) >= count for combo in itertools.combinations(free, k)):
            return k
    raise AssertionError("does not fit at all")


PREFERRED_BLOCK = TopologyRequest("preferred", BLOCK)
REQUIRED_BLOCK = TopologyRequest("required", BLOCK)


@pytest.mark.parametrize(
    "shape, count, blocks",
    [
        # one block holds it: the smallest that does (best fit), leaving the big block whole
        ({"b1": {"r1": 8, "r2": 8}, "b2": {"r1": 4, "r2": 2}, "b3": {"r1": 5}}, 5, {"b3"}),
        # no block holds it: the largest, then the best fit for the rest (b3's 3, keeping b1's 6 whole)
        ({"b1": {"r1": 6}, "b2": {"r1": 7}, "b3": {"r1": 3}, "b4": {"r1": 2}}, 10, {"b2", "b3"}),
        # three blocks, the last chosen by best fit (b4's 3 is enough, b3's 4 is kept)
        ({"b1": {"r1": 5}, "b2": {"r1": 5}, "b3": {"r1": 4}, "b4": {"r1": 3}}, 13, {"b1", "b2", "b4"}),
        # uneven racks per block
        ({"a": {"x": 1, "y": 1, "z": 1}, "b": {"x": 4}}, 3, {"a"}),
    ],
)
def test_preferred_block_spans_the_fewest_blocks_the_best_fit_last(shape, count, blocks):
    slots = fleet(shape)

    result = place(slots, count, PREFERRED_BLOCK)

    assert result.fits and len(result.run) == count
    assert blocks_of(result.run, slots) == blocks
    assert result.spans(BLOCK) == optimum_blocks(slots, count)


def test_inside_a_block_the_run_takes_the_fewest_racks():
    slots = fleet({"b1": {"r1": 2, "r2": 4, "r3": 3, "r4": 1}})

    result = place(slots, 4, PREFERRED_BLOCK)

    assert racks_of(result.run, slots) == {("b1", "r2")}
    result = place(slots, 6, PREFERRED_BLOCK)
    assert racks_of(result.run, slots) == {("b1", "r2"), ("b1", "r1")}  # 4, then the best fit for 2


def test_racks_of_one_name_in_two_blocks_are_two_racks():
    slots = fleet({"b1": {"r1": 2}, "b2": {"r1": 2}})

    result = place(slots, 3, TopologyRequest("preferred", RACK))

    assert result.fits and result.level is None  # no rack, no block holds 3: spread
    assert result.spans(RACK) == 2 and result.domains[RACK] == ["b1/r1", "b2/r1"]


def test_preferred_rack_falls_back_to_one_block_then_says_so():
    slots = fleet({"b1": {"r1": 3, "r2": 3}, "b2": {"r1": 4}})

    result = place(slots, 5, TopologyRequest("preferred", RACK))

    assert result.fits and result.level == BLOCK
    assert blocks_of(result.run, slots) == {"b1"}
    assert f"no {RACK} domain holds 5 free node(s)" in result.reason
    assert f"placed in one {BLOCK} domain instead" in result.reason


def test_required_block_that_no_block_holds_fails_naming_the_largest():
    slots = fleet({"b1": {"r1": 6}, "b2": {"r1": 7}, "b3": {"r1": 3}}, busy={"b2-r1-0"})

    result = place(slots, 10, REQUIRED_BLOCK)

    assert not result.fits and result.run == []
    assert result.reason == (
        f"no {BLOCK} domain holds 10 free node(s) (required); the largest hold: b1 6, b2 6, b3 3"
    )


def test_required_rack_places_in_the_best_fitting_rack():
    slots = fleet({"b1": {"r1": 8, "r2": 3}, "b2": {"r1": 4}})

    result = place(slots, 3, TopologyRequest("required", RACK))

    assert result.fits and result.level == RACK and racks_of(result.run, slots) == {("b1", "r2")}


@pytest.mark.parametrize(
    "shape, busy, count, spares, spare_racks",
    [
        # a block holds run + spare (b2 holds the run only): the spare is in it, in the run's own rack
        ({"b1": {"r1": 4, "r2": 4}, "b2": {"r1": 3}}, set(), 3, 1, {("b1", "r1")}),
        # both blocks hold run + spare: the tighter one (b2), the spare in the run's rack
        ({"b1": {"r1": 5, "r2": 4}, "b2": {"r1": 8}}, set(), 4, 1, {("b2", "r1")}),
        # the run fills its block: the spare goes to another block (no choice), least disruptive there
        ({"b1": {"r1": 4}, "b2": {"r1": 2, "r2": 2}}, set(), 4, 1, {("b2", "r1")}),
    ],
)
def test_spares_sit_beside_the_run(shape, busy, count, spares, spare_racks):
    slots = fleet(shape, busy)

    result = place(slots, count, PREFERRED_BLOCK, spares=spares)

    assert len(result.spares) == spares and not set(result.spares) & set(result.run)
    assert racks_of(result.spares, slots) == spare_racks


def test_a_block_that_holds_run_and_spares_wins_over_a_tighter_fit_for_the_run_alone():
    slots = fleet({"b1": {"r1": 4}, "b2": {"r1": 5}})

    result = place(slots, 4, REQUIRED_BLOCK, spares=1)

    assert blocks_of(result.nodes, slots) == {"b2"}
    assert result.domains[BLOCK] == ["b2"]


def test_required_spares_may_sit_outside_the_required_domain_when_none_holds_both():
    slots = fleet({"b1": {"r1": 4}, "b2": {"r1": 3}})

    result = place(slots, 4, REQUIRED_BLOCK, spares=1)

    assert (
        result.fits and blocks_of(result.run, slots) == {"b1"} and blocks_of(result.spares, slots) == {"b2"}
    )
    assert f"(1 outside the run's {BLOCK} domain)" in result.reason


def test_within_a_domain_the_least_disruptive_nodes_are_taken():
    slots = fleet({"b1": {"r1": 3}}, cost={"b1-r1-0": 5, "b1-r1-1": 0, "b1-r1-2": 1})

    result = place(slots, 2, PREFERRED_BLOCK)

    assert result.run == ["b1-r1-1", "b1-r1-2"]


def test_nodes_without_a_level_label_are_left_out_and_named():
    slots = fleet({"b1": {"r1": 2}})
    slots.append(Slot("loose", {HOSTNAME_LABEL: "loose", BLOCK: "b1"}))

    result = place(slots, 3, PREFERRED_BLOCK)

    assert not result.fits
    assert result.reason == (
        "only 2 free node(s) carry the topology labels, 3 needed; 1 free node(s) lack a topology label "
        f"and are left out (e.g. loose has no {RACK})"
    )


def test_levels_without_hostname_and_two_level_topologies():
    slots = fleet({"b1": {"r1": 2, "r2": 2}, "b2": {"r1": 3}})
    two_levels = TopologyRequest("required", BLOCK, (BLOCK, HOSTNAME_LABEL))
    no_hostname = TopologyRequest("required", RACK, (BLOCK, RACK))

    assert blocks_of(place(slots, 3, two_levels).run, slots) == {"b2"}
    assert racks_of(place(slots, 3, no_hostname).run, slots) == {("b2", "r1")}
    assert place(slots, 4, no_hostname).fits is False


def test_nodes_that_take_several_pods():
    slots = [
        Slot("n1", {BLOCK: "a", RACK: "r", HOSTNAME_LABEL: "n1"}, free=4),
        Slot("n2", {BLOCK: "b", RACK: "r", HOSTNAME_LABEL: "n2"}, free=2),
        Slot("n3", {BLOCK: "b", RACK: "r", HOSTNAME_LABEL: "n3"}, free=2),
    ]

    result = place(slots, 3, TopologyRequest("required", HOSTNAME_LABEL))

    assert result.pods == {"n1": 3}


def test_no_topology_takes_the_least_disruptive_by_name():
    slots = fleet({"b1": {"r1": 2}, "b2": {"r1": 2}}, cost={"b1-r1-0": 3, "b1-r1-1": 3})

    result = place(slots, 2, TopologyRequest(), spares=1)

    assert result.run == ["b2-r1-0", "b2-r1-1"] and result.spares == ["b1-r1-0"]


def test_random_fleets_span_the_optimum_number_of_blocks():
    rng = random.Random(27)
    for _ in range(200):
        shape = {
            f"b{b}": {f"r{r}": rng.randint(1, 6) for r in range(rng.randint(1, 4))}
            for b in range(rng.randint(1, 6))
        }
        all_nodes = [s.name for s in fleet(shape)]
        busy = set(rng.sample(all_nodes, rng.randint(0, len(all_nodes) // 2)))
        slots = fleet(shape, busy)
        free = sum(s.free for s in slots)
        count = rng.randint(1, max(1, free))
        spares = rng.randint(0, 2)
        if free < count:
            continue

        result = place(slots, count, PREFERRED_BLOCK, spares=spares)

        assert result.fits and len(result.run) == count and len(set(result.nodes)) == len(result.nodes)
        assert not set(result.nodes) & busy
        assert result.spans(BLOCK) == optimum_blocks(slots, count), (shape, busy, count)
        assert len(result.spares) == min(spares, free - count)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "sometimes"}, "topology must be one of none, preferred, required, got 'sometimes'"),
        ({"mode": "required", "level": "rack"}, "topology_level 'rack' is not one of the topology's levels"),
        ({"levels": ()}, "topology_levels must be a list of node label keys"),
        ({"levels": ("a b",)}, "topology_levels: 'a b' is not a node label key"),
        ({"levels": (HOSTNAME_LABEL, BLOCK)}, "kubernetes.io/hostname can only be the last"),
        ({"levels": (BLOCK, BLOCK)}, "names a level twice"),
    ],
)
def test_bad_requests_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TopologyRequest(**kwargs)


@pytest.mark.parametrize("count, spares", [(0, 0), (2, -1), (True, 0), ("2", 0)])
def test_bad_counts_are_refused(count, spares):
    with pytest.raises(ValueError, match="must be an integer"):
        place([], count, PREFERRED_BLOCK, spares=spares)


def test_the_pod_template_annotation_is_kueues():
    assert TopologyRequest("preferred", BLOCK).annotation() == {
        "kueue.x-k8s.io/podset-preferred-topology": BLOCK
    }
    assert TopologyRequest("required", RACK).annotation() == {"kueue.x-k8s.io/podset-required-topology": RACK}
    assert TopologyRequest().annotation() == {}


def test_a_run_spread_over_blocks_keeps_its_spares_in_those_blocks():
    slots = fleet({"a": {"r1": 4, "r2": 4, "r3": 3}, "b": {"r1": 4}, "c": {"r1": 5}, "d": {"r1": 6}})

    result = place(slots, 16, PREFERRED_BLOCK, spares=1)

    assert blocks_of(result.run, slots) == {"a", "d"} and blocks_of(result.spares, slots) <= {"a", "d"}
    assert result.spans(BLOCK) == optimum_blocks(slots, 16) == 2
    assert (
        "spread over 2 cloud.provider.com/topology-block domain(s), the fewest that hold them"
        in result.reason
    )
