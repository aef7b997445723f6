"""Inference loans on plain objects: how far each kind shrinks, and exact repayment."""

import copy

import pytest

from trainops.capacity.inference import (
    DEPLOYMENT,
    HPA,
    INFERENCE_SERVICE,
    pdb_floor,
    selector_matches,
    shrink_fields,
)
from trainops.capacity.loans import LOANS_ANNOTATION, lend_patch, repay_patch

A, B = "train/a", "train/b"


def merged(obj: dict, patch: dict | None) -> dict:
    """RFC 7386 JSON merge patch."""
    if patch is None:
        return obj
    out = copy.deepcopy(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = merged(out.get(key) or {}, value)
            if not out[key]:
                del out[key]
        else:
            out[key] = value
    return out


def deployment(replicas: int) -> dict:
    return {
        "metadata": {"name": "llm", "namespace": "inference", "labels": {"app": "llm"}},
        "spec": {"replicas": replicas},
    }


def test_deployment_shrinks_by_displaced_pods_keeping_one_above_the_pdb_floor():
    assert shrink_fields(DEPLOYMENT, deployment(8), 8, 1, floor=6) == {("spec", "replicas"): 7}
    assert shrink_fields(DEPLOYMENT, deployment(8), 8, 3, floor=6) == {("spec", "replicas"): 7}
    assert shrink_fields(DEPLOYMENT, deployment(8), 8, 3, floor=0) == {("spec", "replicas"): 5}
    assert shrink_fields(DEPLOYMENT, deployment(8), 8, 2, floor=6) == {
        ("spec", "replicas"): 6
    }  # exactly the floor
    assert shrink_fields(DEPLOYMENT, deployment(6), 6, 3, floor=6) == {("spec", "replicas"): 6}


def test_loan_round_trip_restores_the_object_exactly_and_is_idempotent():
    before = deployment(8)
    lent = merged(before, lend_patch(before, A, {("spec", "replicas"): 6}))
    assert lent["spec"]["replicas"] == 6 and LOANS_ANNOTATION in lent["metadata"]["annotations"]
    assert lend_patch(lent, A, {("spec", "replicas"): 4}) is None  # a repeated claim does not shrink twice
    returned = merged(lent, repay_patch(lent, A))
    assert returned == before
    assert repay_patch(returned, A) is None


@pytest.mark.parametrize("order", [(A, B), (B, A)])
def test_two_runs_lending_from_one_deployment_repay_in_either_order(order):
    obj = merged(deployment(10), lend_patch(deployment(10), A, {("spec", "replicas"): 8}))
    obj = merged(obj, lend_patch(obj, B, {("spec", "replicas"): 6}))
    first, second = order
    obj = merged(obj, repay_patch(obj, first))
    assert obj["spec"]["replicas"] == 8
    assert merged(obj, repay_patch(obj, second)) == deployment(10)


def test_hpa_bounds_are_lowered_and_restored():
    hpa = {
        "metadata": {"name": "llm"},
        "spec": {
            "minReplicas": 4,
            "maxReplicas": 10,
            "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
        },
    }
    fields = shrink_fields(HPA, hpa, running=6, displaced=3, floor=1)
    assert fields == {("spec", "maxReplicas"): 3, ("spec", "minReplicas"): 3}
    lent = merged(hpa, lend_patch(hpa, A, fields))
    assert (lent["spec"]["minReplicas"], lent["spec"]["maxReplicas"]) == (3, 3)
    assert shrink_fields(HPA, hpa, running=6, displaced=5, floor=3)[("spec", "maxReplicas")] == 4
    assert merged(lent, repay_patch(lent, A)) == hpa
    assert shrink_fields(HPA, hpa, running=2, displaced=2, floor=0)[("spec", "maxReplicas")] == 1


def test_inference_service_is_stopped_when_nothing_may_stay_and_restored_after():
    isvc = {
        "metadata": {"name": "chat", "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
        "spec": {"predictor": {"minReplicas": 1}},
    }
    fields = shrink_fields(INFERENCE_SERVICE, isvc, running=2, displaced=2, floor=0)
    assert fields == {("metadata", "annotations", "serving.kserve.io/stop"): "true"}
    lent = merged(isvc, lend_patch(isvc, A, fields))
    assert lent["metadata"]["annotations"]["serving.kserve.io/stop"] == "true"
    assert merged(lent, repay_patch(lent, A)) == isvc


def test_inference_service_keeps_replicas_the_pdb_protects():
    isvc = {"metadata": {"name": "chat"}, "spec": {"predictor": {"minReplicas": 2, "maxReplicas": 4}}}
    fields = shrink_fields(INFERENCE_SERVICE, isvc, running=4, displaced=3, floor=2)
    assert fields == {("spec", "predictor", "maxReplicas"): 3, ("spec", "predictor", "minReplicas"): 2}
    assert (
        shrink_fields(INFERENCE_SERVICE, isvc, running=4, displaced=3, floor=1)[
            ("spec", "predictor", "maxReplicas")
        ]
        == 1
    )
    lent = merged(isvc, lend_patch(isvc, A, fields))
    assert merged(lent, repay_patch(lent, A)) == isvc


def test_pdb_floor_follows_min_available_and_max_unavailable():
    labels = {"app": "llm", "tier": "gpu"}
    pdb = lambda **spec: {"spec": {"selector": {"matchLabels": {"app": "llm"}}, **spec}}  # noqa: E731
    assert pdb_floor([pdb(minAvailable=6)], labels, 8) == 6
    assert pdb_floor([pdb(minAvailable="50%")], labels, 5) == 3
    assert pdb_floor([pdb(maxUnavailable=1)], labels, 8) == 7
    assert pdb_floor([pdb(maxUnavailable="25%")], labels, 8) == 6
    assert (
        pdb_floor([{"spec": {"selector": {"matchLabels": {"app": "other"}}, "minAvailable": 5}}], labels, 8)
        == 0
    )


def test_selector_matching():
    labels = {"app": "llm", "tier": "gpu"}
    assert selector_matches({}, labels)
    assert not selector_matches(None, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)
