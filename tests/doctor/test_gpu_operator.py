"""What a ClusterPolicy says of the operator's version and CDI, as the chart writes it and as older
operators leave it (cdi.enabled unset: off before v25.10.0, on from it)."""

from __future__ import annotations

import pytest

from trainops.doctor.gpu_operator import cdi_enabled, driver_upgrade, operator_version


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


# -- driver upgrades: does the driver manager move the probe off a node before it unloads the driver?

WHERE = "kube-system/trainops-node-probe"
CLIENT = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "true"}  # deploy/node-probe.yaml
GPU_ONLY = {"nvidia.com/gpu.present": "true"}  # the probe before it followed the client-pod convention


def probe(node_selector: dict | None = None, args: tuple[str, ...] = ("--publish",), affinity=None) -> dict:
    spec = {"nodeSelector": node_selector or {}, "containers": [{"name": "probe", "args": list(args)}]}
    if affinity:
        term = {"matchExpressions": [{"key": k, "operator": "In", "values": v} for k, v in affinity.items()]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {"spec": {"template": {"spec": spec}}}


def operator(version: str | None = None, manager_version: str | None = None, env=None, enabled=None) -> dict:
    driver: dict = {"manager": {"env": [{"name": k, "value": v} for k, v in (env or {}).items()]}}
    if manager_version:
        driver["manager"]["version"] = manager_version
    if enabled is not None:
        driver["enabled"] = enabled
    labels = {"app.kubernetes.io/version": version} if version else {}
    return {"metadata": {"name": "cluster-policy", "labels": labels}, "spec": {"driver": driver}}


def upgrade(policy: dict, daemon_set: dict | None) -> tuple[str, list]:
    return driver_upgrade(policy, operator_version(policy), daemon_set, WHERE)


def test_on_gpu_operator_26_7_the_client_label_moves_the_probe_and_the_driver_manager_waits_for_it():
    summary, problems = upgrade(operator("v26.7.0"), probe(CLIENT))
    assert problems == [] and "nvidia.com/gpu.deploy.client, waited for" in summary
    # the chart names the driver manager's version: that decides, whatever the operator's labels say
    assert upgrade(operator(None, "v0.12.0"), probe(CLIENT))[1] == []


def test_a_probe_on_no_label_the_driver_manager_flips_stalls_the_upgrade_and_the_fix_names_the_label():
    _, (problem,) = upgrade(operator("v26.7.0", env={"ENABLE_GPU_POD_EVICTION": "true"}), probe(GPU_ONLY))
    assert f"the probe DaemonSet {WHERE} opens NVML but is neither evicted" in problem.what
    assert "never DaemonSet pods" in problem.what and "driver is in use" in problem.what
    assert (
        problem.fix == 'add nvidia.com/gpu.deploy.client: "true" to its nodeSelector (deploy/node-probe.yaml)'
    )


def test_before_26_7_the_client_label_is_not_paused_unless_the_driver_manager_is_told_to():
    _, (problem,) = upgrade(operator("v25.10.0"), probe(CLIENT))
    assert (
        "which the driver manager of GPU Operator v25.10.0 (older than v0.12.0) does not set" in problem.what
    )
    assert "NODE_LABEL_FOR_GPU_POD_EVICTION names no label" in problem.what
    assert "NODE_LABEL_FOR_GPU_POD_EVICTION=nvidia.com/gpu.deploy.client in ClusterPolicy" in problem.fix
    # as deploy/node-probe.yaml says for older operators: paused, not waited for, and the probe lets NVML go
    told = operator("v25.10.0", env={"NODE_LABEL_FOR_GPU_POD_EVICTION": "nvidia.com/gpu.deploy.client"})
    summary, problems = upgrade(told, probe(CLIENT))
    assert problems == [] and "without waiting for it to go (it lets NVML go between samples)" in summary
    # ... unless it holds NVML between samples
    _, (held,) = upgrade(told, probe(CLIENT, args=("--publish", "--hold-nvml")))
    assert "runs with --hold-nvml" in held.what and "drop --hold-nvml" in held.fix
    # --gemm's CUDA context holds the driver for the probe's life too, written any way
    for args in (("--publish", "--gemm"), ("-c", "trainops probe --publish --gemm --interval 60")):
        _, (held,) = upgrade(told, probe(CLIENT, args=args))
        assert "runs with --gemm" in held.what and "drop --gemm" in held.fix
    assert upgrade(told, probe(CLIENT, args=("--publish", "--gemm-size", "4096")))[1] == []


def test_without_a_version_to_go_by_the_check_says_it_cannot_tell():
    _, (problem,) = upgrade(operator(None), probe(CLIENT))
    assert "the driver manager of this GPU Operator (version unknown" in problem.what


def test_node_affinity_on_the_label_pauses_the_probe_but_the_driver_manager_waits_only_for_node_selectors():
    summary, problems = upgrade(
        operator("v26.7.0"), probe(GPU_ONLY, affinity={"nvidia.com/gpu.deploy.client": ["true"]})
    )
    assert problems == [] and "node affinity on nvidia.com/gpu.deploy.client without waiting" in summary


def test_a_host_driver_is_never_unloaded_under_the_probe_and_no_probe_is_no_finding_here():
    assert upgrade(operator("v25.10.0", enabled=False), probe(GPU_ONLY)) == (
        "driver on the host (no upgrade unloads it)",
        [],
    )
    assert upgrade(operator("v26.7.0"), None) == ("", [])
