"""ClusterQueue GPU grants, on plain data: the quota moves by what each run was granted, once."""

import copy
import json

import pytest

from trainops.capacity.quota import GRANTS_ANNOTATION, QuotaError, grant_patch

RUN, OTHER = "train/r1", "train/r2"


def cluster_queue(gpu_quota="0", flavors=("gpu",)) -> dict:
    return {
        "metadata": {"name": "training", "resourceVersion": "5"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": f,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "10"},
                                {"name": "nvidia.com/gpu", "nominalQuota": gpu_quota},
                            ],
                        }
                        for f in flavors
                    ],
                }
            ]
        },
    }


def applied(cq: dict, patch: dict | None) -> dict:
    """What the API server holds after a JSON merge patch (enough of RFC 7386 for these objects)."""
    cq = copy.deepcopy(cq)
    if patch is None:
        return cq
    annotations = cq["metadata"].setdefault("annotations", {})
    for key, value in patch["metadata"]["annotations"].items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    if not annotations:
        del cq["metadata"]["annotations"]
    cq["spec"]["resourceGroups"] = patch["spec"]["resourceGroups"]
    return cq


def gpu_quota(cq: dict, flavor: str = "gpu"):
    group = cq["spec"]["resourceGroups"][0]
    return next(
        r["nominalQuota"]
        for f in group["flavors"]
        if f["name"] == flavor
        for r in f["resources"]
        if r["name"] == "nvidia.com/gpu"
    )


def test_grant_raises_quota_once_and_return_restores_the_object():
    before = cluster_queue("0")
    granted = applied(before, grant_patch(before, RUN, 16))
    assert gpu_quota(granted) == "16"
    assert json.loads(granted["metadata"]["annotations"][GRANTS_ANNOTATION]) == {
        RUN: {"flavor": "gpu", "gpus": 16}
    }
    assert grant_patch(granted, RUN, 16) is None  # a repeated claim counts nothing twice
    returned = applied(granted, grant_patch(granted, RUN, 0))
    assert returned == before
    assert grant_patch(returned, RUN, 0) is None  # a repeated return is a no-op


def test_two_runs_add_up_and_return_in_any_order():
    cq = applied(cluster_queue(8), grant_patch(cluster_queue(8), RUN, 16))
    cq = applied(cq, grant_patch(cq, OTHER, 8))
    assert gpu_quota(cq) == 32
    cq = applied(cq, grant_patch(cq, RUN, 0))
    assert gpu_quota(cq) == 16
    assert applied(cq, grant_patch(cq, OTHER, 0)) == cluster_queue(8)


def test_a_changed_claim_moves_quota_by_the_difference():
    cq = applied(cluster_queue("4"), grant_patch(cluster_queue("4"), RUN, 16))
    assert gpu_quota(applied(cq, grant_patch(cq, RUN, 24))) == "28"


def test_flavor_must_be_named_when_several_hold_gpu_quota():
    cq = cluster_queue(flavors=("h100", "h200"))
    with pytest.raises(QuotaError, match=r"\['h100', 'h200'\].*gpu_flavor"):
        grant_patch(cq, RUN, 8)
    assert gpu_quota(applied(cq, grant_patch(cq, RUN, 8, "h200")), "h200") == "8"
    with pytest.raises(QuotaError, match="'a100' is not one of them"):
        grant_patch(cq, RUN, 8, "a100")
