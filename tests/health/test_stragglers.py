"""Straggler maths and speed tiers on fixed numbers."""

from __future__ import annotations

import pytest

from trainops.health.outliers import modified_z_scores
from trainops.health.policy import NodeVerdict
from trainops.health.report import HealthReport, Signal
from trainops.health.stragglers import choose_nodes, node_speed, percent_below_median


def ok(*names: str) -> list[NodeVerdict]:
    return [NodeVerdict(name, "ok") for name in names]


def test_modified_z_and_percent_below_on_fixed_numbers():
    speeds = {"a": 100.0, "b": 101.0, "c": 99.0, "d": 100.0, "e": 70.0}
    # median 100, absolute deviations 0 1 1 0 30 -> MAD 1
    assert modified_z_scores(speeds)["e"] == pytest.approx(0.6745 * -30)
    assert modified_z_scores(speeds)["b"] == pytest.approx(0.6745)
    assert percent_below_median(speeds) == pytest.approx({"a": 0, "b": -1, "c": 1, "d": 0, "e": 30})


def test_thirty_percent_slow_node_is_left_out_of_the_tier():
    speeds = {"a": 100.0, "b": 101.0, "c": 99.0, "d": 100.0, "e": 70.0}
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=3)
    assert selection.node_names == ["b", "a", "d", "c"]
    assert selection.enough and selection.tier == (99.0, 101.0)
    assert selection.excluded == {"e": "exclude: straggler, 30.0% below fleet median (z=-20.2)"}


def test_zero_mad_falls_back_to_mean_absolute_deviation():
    speeds = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 90.0}
    # MAD is 0; mean absolute deviation 2.5 -> z(d) = -10 / (1.253314 * 2.5)
    assert modified_z_scores(speeds)["d"] == pytest.approx(-10 / (1.253314 * 2.5))
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=2)
    assert selection.node_names == ["a", "b", "c"] and "straggler, 10.0% below" in selection.excluded["d"]


def test_ties_are_all_kept_in_name_order():
    speeds = dict.fromkeys(["n3", "n1", "n2"], 95.0)
    assert modified_z_scores(speeds) == {"n3": 0.0, "n1": 0.0, "n2": 0.0}
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=3)
    assert (selection.node_names, selection.tier, selection.excluded) == (
        ["n1", "n2", "n3"],
        (95.0, 95.0),
        {},
    )


def test_small_slowdown_in_a_tight_fleet_is_not_a_straggler():
    speeds = {"a": 100.0, "b": 100.1, "c": 99.9, "d": 100.0, "e": 98.0}  # e: z << -2 but only 2% slow
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=5)
    assert selection.node_names == ["b", "a", "d", "c", "e"] and selection.excluded == {}


def test_fastest_tier_that_is_large_enough():
    speeds = {"a": 100.0, "b": 99.0, "c": 98.0, "d": 90.0, "e": 89.0, "f": 88.0}
    first = choose_nodes(ok(*speeds), speeds, min_nodes=3)
    assert first.node_names == ["a", "b", "c"] and first.tier == (98.0, 100.0)
    assert first.excluded["d"] == "exclude: speed 90.0 outside the chosen tier"


def test_too_few_for_any_tier_gives_all_untiered():
    speeds = {"a": 100.0, "b": 99.0, "c": 98.0, "d": 90.0, "e": 89.0, "f": 88.0}
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=4)
    assert (selection.node_names, selection.tier, selection.enough) == (
        ["a", "b", "c", "d", "e", "f"],
        None,
        True,
    )
    assert not choose_nodes(ok(*speeds), speeds, min_nodes=7).enough


def test_bad_verdicts_are_excluded_and_unknown_speed_is_grouped_apart_from_a_large_enough_tier():
    verdicts = [
        *ok("a", "b"),
        NodeVerdict("q", "quarantine", ["xid_fatal [gpu 0] fatal XID"]),
        NodeVerdict("w", "warn", ["gpu_in_use [gpu 1] processes"]),
        NodeVerdict("u", "ok"),
    ]
    selection = choose_nodes(
        verdicts, {"a": 100.0, "b": 100.0, "w": 100.0, "q": 100.0, "u": None}, min_nodes=3
    )
    assert (selection.node_names, selection.group, selection.speed_unknown) == (
        ["a", "b", "w"],
        "tier",
        ["u"],
    )
    assert selection.excluded == {
        "q": "quarantine: xid_fatal [gpu 0] fatal XID",
        "u": "exclude: speed unknown, grouped apart from the chosen tier of measured speed",
    }


def test_unknown_speed_never_excludes_by_default():
    """The shipped probe runs without --gemm: no node has a speed, and every healthy node is chosen."""
    speeds = dict.fromkeys(["a", "b", "c"])
    selection = choose_nodes(ok("c", "a", "b"), speeds, min_nodes=3)
    assert (selection.node_names, selection.enough, selection.excluded) == (["a", "b", "c"], True, {})
    assert (selection.group, selection.speed_unknown) == ("speed unknown", ["a", "b", "c"])


def test_too_few_measured_nodes_for_a_tier_take_the_unknown_group_then_everyone():
    speeds = {"a": 100.0, "b": None, "c": None, "d": None}
    grouped = choose_nodes(ok(*speeds), speeds, min_nodes=3)
    assert (grouped.node_names, grouped.group) == (["b", "c", "d"], "speed unknown")
    assert grouped.excluded["a"].startswith("exclude: no tier of 3 measured node(s)")
    everyone = choose_nodes(ok(*speeds), speeds, min_nodes=4)
    assert (everyone.node_names, everyone.group, everyone.enough) == (["a", "b", "c", "d"], "untiered", True)


def test_unknown_speed_excluded_only_when_asked():
    speeds = {"a": 100.0, "b": 100.0, "u": None}
    selection = choose_nodes(ok(*speeds), speeds, min_nodes=3, unknown_speed="exclude")
    assert (selection.node_names, selection.enough) == (["a", "b"], False)
    assert selection.excluded == {"u": "exclude: speed unknown (unknown_speed='exclude')"}
    with pytest.raises(ValueError, match="unknown_speed must be one of group, exclude"):
        choose_nodes(ok("a"), speeds, min_nodes=1, unknown_speed="drop")


def test_without_speeds_every_usable_node_is_chosen():
    selection = choose_nodes([*ok("b", "a"), NodeVerdict("c", "exclude", ["x"])], {}, min_nodes=3)
    assert (selection.node_names, selection.enough, selection.tier) == (["a", "b"], False, None)
    with pytest.raises(ValueError, match="min_nodes must be >= 1"):
        choose_nodes([], {}, min_nodes=0)


def test_node_speed_is_the_slowest_gpu():
    report = HealthReport(
        "n", 0.0, "probe", gpus={"0": {"gemm_tflops": Signal(700.0)}, "1": {"gemm_tflops": Signal(650.0)}}
    )
    assert node_speed(report).value == 650.0
    report.gpus["1"]["gemm_tflops"] = Signal.unknown("CUDA is not available to torch")
    assert node_speed(report).reason == "CUDA is not available to torch"
    assert node_speed(HealthReport("n", 0.0, "probe")).reason == "no GPUs in report"
