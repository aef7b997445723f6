"""What a ClusterPolicy says of the operator's version and CDI, as the chart writes it and as older
operators leave it (cdi.enabled unset: off before v25.10.0, on from it)."""

from __future__ import annotations

import pytest

from trainops.doctor.gpu_operator import cdi_enabled, operator_version


def policy(labels: dict | None = None, cdi: dict | None = None) -> dict:
    return {"metadata": {"name": "cluster-policy", "labels": labels or {}}, "spec": {"cdi": cdi or {}}}


@pytest.mark.parametrize(
    ("labels", "version"),
    [
        ({"app.kubernetes.io/version": "v25.10.0", "helm.sh/chart": "gpu-operator-v25.10.0"}, "v25.10.0"),
        ({"helm.sh/chart": "gpu-operator-v24.9.2"}, "v24.9.2"),
        ({"helm.sh/chart": "other-1.0"}, None),
        ({}, None),  # installed by OLM or by hand: no chart labels
    ],
)
def test_the_operator_version_from_the_charts_labels(labels, version):
    assert operator_version(policy(labels)) == version


@pytest.mark.parametrize(
    ("cdi", "version", "enabled"),
    [
        ({"enabled": False}, "v25.10.0", False),  # the chart writes it: what it says holds
        ({"enabled": True}, "v24.9.2", True),
        ({}, "v25.10.0", True),  # unset: the operator's default for its version
        ({}, "v25.3.1", False),
        ({}, None, False),
    ],
)
def test_cdi_as_set_or_as_the_operators_version_defaults_it(cdi, version, enabled):
    assert cdi_enabled(policy(cdi=cdi), version) is enabled
