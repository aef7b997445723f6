"""Taint planning and claim records, on plain node data."""

import json

import pytest

from trainops.capacity import claims
from trainops.kube.nodes import NodeState, node_patch, with_taint

MODE_INFERENCE = {"key": "trainops.io/mode", "value": "inference", "effect": "NoSchedule"}
GPU_OPERATOR = {"key": "nvidia.com/gpu-driver-upgrade", "value": "pending", "effect": "NoSchedule"}
CORDON = {
    "key": "node.kubernetes.io/unschedulable",
    "effect": "NoSchedule",
    "timeAdded": "2024-01-01T00:00:00Z",
}
RUN = "train_llm/manual__1"


def node(taints=(MODE_INFERENCE,), annotations=None, labels=None) -> NodeState:
    return NodeState(
        "gpu-node-000", dict(labels or {"a": "b"}), dict(annotations or {"x": "y"}), list(taints)
    )


def test_claim_flips_mode_taint_in_place_and_records_prior_state():
    before = node([GPU_OPERATOR, MODE_INFERENCE, CORDON])
    after = claims.claim(RUN, "2025-01-01T00:00:00Z")(before)
    assert after.taints == [GPU_OPERATOR, claims.TRAINING_TAINT, CORDON]
    assert after.annotations["trainops.io/claimed-by"] == RUN
    assert after.annotations["trainops.io/claimed-at"] == "2025-01-01T00:00:00Z"
    assert json.loads(after.annotations["trainops.io/claim-prior"]) == {"modeTaint": MODE_INFERENCE}
    assert after.labels == before.labels and after.annotations["x"] == "y"
    assert all(t["effect"] == "NoSchedule" for t in after.taints)


def test_release_restores_exactly_and_keeps_taints_added_meanwhile():
    before = node([GPU_OPERATOR, MODE_INFERENCE])
    claimed = claims.claim(RUN, "t")(before)
    touched = with_taint(claimed, CORDON)  # someone cordons the node while it trains
    returned = claims.release(RUN)(touched)
    assert returned.taints == [GPU_OPERATOR, MODE_INFERENCE, CORDON]
    assert returned.annotations == before.annotations and returned.labels == before.labels


def test_release_of_a_node_that_had_no_mode_taint_removes_the_training_taint():
    before = node([GPU_OPERATOR])
    returned = claims.release(RUN)(claims.claim(RUN, "t")(before))
    assert returned == before


def test_claim_and_release_are_idempotent():
    claimed = claims.claim(RUN, "t")(node())
    assert claims.claim(RUN, "later")(claimed) == claimed
    returned = claims.release(RUN)(claimed)
    assert claims.release(RUN)(returned) == returned
    assert node_patch(returned, claims.release(RUN)(returned)) is None


def test_a_node_held_by_another_run_is_never_taken_nor_released():
    held = claims.claim("other_dag/run_7", "t")(node())
    with pytest.raises(claims.NodesHeld, match=r"gpu-node-000 \(held by other_dag/run_7\)") as error:
        claims.claim(RUN, "t")(held)
    assert error.value.holders == {"gpu-node-000": "other_dag/run_7"}
    assert claims.release(RUN)(held) == held


def test_quarantined_node_is_refused_and_stays_quarantined_on_release():
    quarantine = {"key": "trainops.io/quarantine", "value": "xid-79", "effect": "NoSchedule"}
    with pytest.raises(claims.NodeQuarantined, match="trainops health release"):
        claims.claim(RUN, "t")(node([MODE_INFERENCE, quarantine]))
    claimed = claims.claim(RUN, "t")(node())
    quarantined = with_taint(claimed, quarantine)
    returned = claims.release(RUN)(quarantined)
    assert returned.taints == [MODE_INFERENCE, quarantine]


def test_release_refuses_a_damaged_claim_record_naming_the_annotation():
    claimed = claims.claim(RUN, "t")(node())
    damaged = NodeState(
        claimed.name, claimed.labels, {**claimed.annotations, "trainops.io/claim-prior": "{"}, claimed.taints
    )
    with pytest.raises(claims.ClaimError, match="trainops.io/claim-prior"):
        claims.release(RUN)(damaged)


def test_node_patch_writes_taints_whole_and_only_changed_keys():
    before = node([GPU_OPERATOR, MODE_INFERENCE], annotations={"keep": "1", "drop": "2"})
    after = NodeState(
        before.name, before.labels, {"keep": "1", "new": "3"}, [GPU_OPERATOR, claims.TRAINING_TAINT]
    )
    assert node_patch(before, after) == {
        "metadata": {"annotations": {"drop": None, "new": "3"}},
        "spec": {"taints": [GPU_OPERATOR, claims.TRAINING_TAINT]},
    }
    assert node_patch(before, before) is None


@pytest.mark.parametrize("bad", ["no-slash", "/run", "dag/", "a/b/c", ""])
def test_run_key_must_be_dag_and_run(bad):
    with pytest.raises(ValueError, match="<dag_id>/<run_id>"):
        claims.parse_run(bad)
