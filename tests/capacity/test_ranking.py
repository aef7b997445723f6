"""Which candidate nodes a claim takes: the least disruptive ones (plain data)."""

from __future__ import annotations

import pytest

from trainops.capacity.ranking import least_disruptive


def pod(node: str, *, daemonset: bool = False, phase: str = "Running") -> dict:
    owners = [{"kind": "DaemonSet", "name": "probe"}] if daemonset else [{"kind": "ReplicaSet", "name": "rs"}]
    return {
        "metadata": {"name": f"p-{node}", "namespace": "inference", "ownerReferences": owners},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_idle_nodes_first_then_the_fewest_pods_a_drain_must_move():
    pods = [pod("a"), pod("a"), pod("b"), pod("c", daemonset=True), pod("d", phase="Succeeded")]

    assert least_disruptive(["a", "b", "c", "d"], pods, 3) == ["c", "d", "b"]


def test_nodes_held_by_other_runs_come_last_even_when_idle():
    pods = [pod("a"), pod("b")]

    assert least_disruptive(["a", "b", "c"], pods, 2, held={"c"}) == ["a", "b"]
    assert least_disruptive(["a", "b", "c"], pods, 3, held={"c"}) == ["a", "b", "c"]


def test_ties_break_by_name_so_the_choice_is_stable():
    assert least_disruptive(["n3", "n1", "n2"], [], 2) == ["n1", "n2"]


@pytest.mark.parametrize(
    "count, message",
    [
        (4, "count: 4 node(s) to claim, but only 3 candidate(s)"),
        (0, "count must be an integer >= 1"),
        ("2", "count must be an integer >= 1, got '2'"),
        (True, "count must be an integer"),
    ],
)
def test_a_count_the_candidates_cannot_meet_is_refused_naming_count(count, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        least_disruptive(["a", "b", "c"], [], count)
