"""What the doctor expects is what deploy/ ships: the probe's admission policies by name, and GPU
Operator's tolerations (also what the devcluster's ClusterPolicy carries)."""

from __future__ import annotations

from pathlib import Path

import yaml
from trainops_devcluster import topology

from trainops.doctor.admission import POLICIES
from trainops.placement.scheduling import untolerated

DEPLOY = Path(__file__).parents[2] / "deploy"


def test_the_admission_policies_the_doctor_looks_for_are_those_deploy_ships():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "node-probe-admission.yaml").read_text()) if d]
    shipped = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert tuple(shipped) == POLICIES


def test_gpu_operator_values_tolerate_every_trainops_taint_as_the_devclusters_cluster_policy_does():
    values = yaml.safe_load((DEPLOY / "gpu-operator-values.yaml").read_text())
    assert values["daemonsets"]["tolerations"] == topology.GPU_OPERATOR_TOLERATIONS
    assert untolerated(values["daemonsets"]["tolerations"]) == []
    assert untolerated(values["node-feature-discovery"]["worker"]["tolerations"]) == []
