"""Where a DaemonSet's pods may go, as the scheduler decides it: tolerations against trainops' taints,
node selectors and required node affinity against a node."""

from __future__ import annotations

import pytest

from trainops.placement.scheduling import (
    TRAINOPS_TAINTS,
    Taint,
    selects,
    tolerates,
    tolerations_for,
    untolerated,
)

INFERENCE, TRAINING, QUARANTINE = TRAINOPS_TAINTS
MODE = {"key": "trainops.io/mode", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("tolerations", "left"),
    [
        ([{"operator": "Exists"}], []),  # the probe's: everything
        (
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            [INFERENCE, TRAINING, QUARANTINE],
        ),
        ([MODE], [QUARANTINE]),
        ([MODE, {"key": "trainops.io/quarantine", "operator": "Exists"}], []),  # no effect: every effect
        ([{**MODE, "effect": "NoExecute"}], [INFERENCE, TRAINING, QUARANTINE]),
        ([{"key": "trainops.io/mode", "value": "inference", "effect": "NoSchedule"}], [TRAINING, QUARANTINE]),
        # a quarantine's value names the failure (xid-79, ecc...): only Exists tolerates them all
        ([MODE, {"key": "trainops.io/quarantine", "operator": "Equal", "value": "xid-79"}], [QUARANTINE]),
        ([], [INFERENCE, TRAINING, QUARANTINE]),
    ],
)
def test_tolerations_against_every_trainops_taint(tolerations, left):
    assert untolerated(tolerations) == left


def test_the_tolerations_a_fix_names_cover_every_taint_each_once():
    """The fix doctor prints for a DaemonSet missing every trainops taint (on a real cluster it named
    the trainops.io/mode toleration twice, once per mode)."""
    wanted = tolerations_for(TRAINOPS_TAINTS)
    assert wanted == [MODE, {"key": "trainops.io/quarantine", "operator": "Exists", "effect": "NoSchedule"}]
    assert untolerated(wanted) == []


def test_an_equal_toleration_matches_the_value():
    assert tolerates({"key": "a", "value": "x"}, Taint("a", "x")) and not tolerates(
        {"key": "a", "value": "y"}, Taint("a", "x")
    )


NODE = {
    "metadata": {
        "name": "gpu-node-001",
        "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"},
    }
}


def affinity(*terms: dict) -> dict:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


@pytest.mark.parametrize(
    ("spec", "placed"),
    [
        ({}, True),
        ({"nodeSelector": {"nvidia.com/gpu.present": "true"}}, True),
        ({"nodeSelector": {"nvidia.com/gpu.present": "false"}}, False),
        (
            affinity(
                {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["4"]}]}
            ),
            True,
        ),
        (
            affinity(
                {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["4"]}]}
            ),
            False,
        ),
        (
            affinity(
                {
                    "matchExpressions": [
                        {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "Exists"}
                    ]
                }
            ),
            False,
        ),
        (affinity({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}), True),
        (
            affinity(
                {"matchExpressions": [{"key": "x", "operator": "In", "values": ["1"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-001"]}]},
            ),
            True,
        ),
        (
            affinity(
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}
                    ]
                }
            ),
            False,
        ),
    ],
)
def test_node_selectors_and_required_affinity(spec, placed):
    assert selects(spec, NODE) is placed
