"""Which candidate nodes a claim takes: the least disruptive ones (plain data)."""

from __future__ import annotations

import pytest

from trainops.capacity.ranking import least_disruptive


def pod(node: str, *, daemonset: bool = False, phase: str = "Running", app: str = "chat") -> dict:
    owners = [{"kind": "DaemonSet", "name": "probe"}] if daemonset else [{"kind": "ReplicaSet", "name": "rs"}]
    return {
        "metadata": {
            "name": f"p-{node}",
            "namespace": "inference",
            "labels": {"app": app},
            "ownerReferences": owners,
        },
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


def budget(app: str, allowed: int | None, namespace: str = "inference") -> dict:
    return {
        "metadata": {"name": f"{app}-pdb", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}, "minAvailable": 1},
        **({"status": {"disruptionsAllowed": allowed}} if allowed is not None else {}),
    }


@pytest.mark.parametrize(
    "budgets, taken",
    [
        ([], ["a"]),  # no budget: the fewest pods
        ([budget("solo", 1)], ["a"]),  # its budget allows a disruption now
        ([budget("solo", 0)], ["b"]),  # the drain of a would wait on its budget: b's three pods go now
        ([budget("solo", None)], ["b"]),  # a budget the controller has not counted yet refuses too
        ([budget("solo", 1), budget("solo", 1)], ["b"]),  # two budgets select it: the API refuses
        ([budget("solo", 0, namespace="other")], ["a"]),  # a budget selects pods in its own namespace only
    ],
)
def test_a_node_whose_pods_a_budget_holds_now_is_taken_last(budgets, taken):
    pods = [pod("a", app="solo"), pod("b"), pod("b"), pod("b")]

    assert least_disruptive(["a", "b"], pods, 1, pdbs=budgets) == taken
    assert least_disruptive(["a", "b", "c"], pods, 2, pdbs=budgets) == ["c", *taken]


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
