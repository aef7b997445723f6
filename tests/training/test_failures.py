"""Failure classification from the pods, nodes and logs of a failed attempt."""

import pytest

from trainops.training.blame import reason_code
from trainops.training.failures import FailureKind, classify, gpu_errors


def pod(name, node, exit_code, *, reason="Error", message="", finished="2025-01-01T00:00:10Z", **status):
    terminated = {"exitCode": exit_code, "reason": reason, "message": message, "finishedAt": finished}
    return {
        "metadata": {"name": name, **({"deletionTimestamp": "x"} if status.pop("deleted", False) else {})},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
            **status,
        },
    }


def node(name, ready="True", gpu=None, labels=None):
    conditions = [
        {
            "type": "Ready",
            "status": ready,
            "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown",
        }
    ]
    if gpu is not None:
        conditions.append({"type": "GPUHealthy", "status": gpu, "message": "XID 79 on GPU 0"})
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"conditions": conditions}}


NODES = {n: node(n) for n in ("a", "b")}


@pytest.mark.parametrize(
    "printed",
    [
        "step 41\nNVRM: Xid (PCI:0000:3b:00): 79, pid=123, GPU has fallen off the bus.\n",
        "Xid 13: Graphics Exception\n",
        "RuntimeError: CUDA error: an illegal memory access was encountered\n",
    ],
)
def test_gpu_errors_in_the_users_log_are_hints_never_blame(printed):
    pods = [
        pod("p0", "a", 1, finished="2025-01-01T00:00:05Z"),
        pod("p1", "b", 143, finished="2025-01-01T00:00:06Z", deleted=True),
    ]
    failure = classify(pods, NODES, {"p0": printed})
    assert failure.kind is FailureKind.USER_CODE and failure.culprits == {}
    assert failure.hints and all(h.startswith("pod p0 on a printed ") for h in failure.hints)
    assert failure.to_dict()["hints"] == failure.hints


def with_gpus(obj, capacity, allocatable):
    obj["status"]["capacity"] = {"nvidia.com/gpu": capacity, "cpu": "96"}
    obj["status"]["allocatable"] = {"nvidia.com/gpu": allocatable, "cpu": "95500m"}
    return obj


def test_a_gpu_its_device_plugin_took_out_of_allocatable_blames_the_node_without_waiting_for_the_probe():
    nodes = {"a": with_gpus(node("a"), "8", "7"), "b": with_gpus(node("b"), "8", "8")}
    logs = {"p0": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"}

    failure = classify([pod("p0", "a", 1)], nodes, logs)

    assert failure.kind is FailureKind.INFRASTRUCTURE
    assert failure.culprits == {
        "a": {
            "problems": [
                "1 GPU(s) unhealthy: the device plugin took them out of allocatable "
                "(nvidia.com/gpu capacity 8, allocatable 7)"
            ]
        }
    }
    assert reason_code("; ".join([*failure.culprits["a"]["problems"], *failure.hints])) == "xid-79"
    assert reason_code(failure.culprits["a"]["problems"][0]) == "gpu-unhealthy"


@pytest.mark.parametrize(
    ("capacity", "allocatable"),
    [("8", "8"), (None, "7"), ("8", None), ("8", "a lot"), ("0", "0"), ("8", "0")],
    ids=["equal", "no-capacity", "no-allocatable", "unreadable", "no-gpus", "device-plugin-gone"],
)
def test_allocatable_equal_to_capacity_unreadable_or_zero_is_no_evidence(capacity, allocatable):
    """All GPUs out of allocatable is the device plugin gone (restarted, paused for a driver upgrade,
    which also evicts the run's pods), not a node whose every GPU failed: nobody is blamed for it."""
    obj = node("a")
    obj["status"]["capacity"] = {} if capacity is None else {"nvidia.com/gpu": capacity}
    obj["status"]["allocatable"] = {} if allocatable is None else {"nvidia.com/gpu": allocatable}

    failure = classify([pod("p0", "a", 1)], {"a": obj}, {"p0": "Xid 79"})

    assert failure.kind is FailureKind.USER_CODE and failure.culprits == {}


def test_the_node_probes_word_blames_the_node_and_the_log_stays_a_hint():
    nodes = {"a": node("a", gpu="False"), "b": node("b")}
    logs = {"p0": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"}
    failure = classify([pod("p0", "a", 1)], nodes, logs)
    assert failure.kind is FailureKind.INFRASTRUCTURE and set(failure.culprits) == {"a"}
    assert all("Xid" not in p and "XID" not in p for p in failure.culprits["a"]["problems"][1:])
    assert failure.hints == [
        "pod p0 on a printed 'XID 79'",
        "pod p0 on a printed 'GPU has fallen off the bus'",
    ]


def test_unhealthy_or_lost_node_is_blamed_even_without_logs():
    nodes = {"a": node("a", gpu="False"), "b": node("b", ready="Unknown")}
    failure = classify([pod("p0", "a", 137), pod("p1", "b", 137)], nodes)
    assert failure.kind is FailureKind.INFRASTRUCTURE
    assert set(failure.culprits) == {"a", "b"}
    assert any("GPUHealthy=False" in p for p in failure.culprits["a"]["problems"])
    assert any("not Ready" in p for p in failure.culprits["b"]["problems"])


def test_health_verdict_from_telemetry_blames_the_node():
    failure = classify([pod("p0", "a", 1)], NODES, node_health={"a": ["xid_fatal: XID 79 on GPU 3"]})
    assert failure.kind is FailureKind.INFRASTRUCTURE and set(failure.culprits) == {"a"}


def test_nccl_timeout_without_node_evidence_counts_against_the_code_with_a_hint():
    failure = classify(
        [pod("p0", "a", 1, message="Watchdog caught collective operation timeout: WorkNCCL(...)")], NODES
    )
    assert failure.kind is FailureKind.USER_CODE and failure.culprits == {}
    assert failure.hints == ["pod p0 on a printed 'Watchdog caught collective operation timeout'"]


@pytest.mark.parametrize(
    "printed",
    [
        "NCCL error: InfiniBand port mlx5_0/1 is down",  # the devcluster's ib-down fault
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled system error",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45012> with status=IBV_WC_RETRY_EXC_ERR(12)",
    ],
)
def test_nccl_errors_of_a_broken_fabric_are_hints(printed):
    # without a hint the attempt failed as user code at once, before the node probe's report of the
    # downed port arrived: the evidence wait and the unconfirmed-fault retry start only on a hint
    failure = classify([pod("p0", "a", 1, message=printed)], NODES)
    assert failure.kind is FailureKind.USER_CODE and failure.culprits == {}
    assert len(failure.hints) == 1 and failure.hints[0].startswith("pod p0 on a printed ")


def test_disrupted_pod_is_infrastructure():
    status = {
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]
    }
    failure = classify([pod("p0", "a", 143, **status)], NODES)
    assert failure.kind is FailureKind.INFRASTRUCTURE and "DeletionByTaintManager" in failure.reason


def test_exit_1_without_infrastructure_evidence_is_user_code_even_when_peers_were_killed():
    pods = [
        pod("p1", "b", 143, finished="2025-01-01T00:00:10Z", deleted=True),
        pod("p0", "a", 1, message="ZeroDivisionError", finished="2025-01-01T00:00:10Z"),
    ]
    failure = classify(pods, NODES, {"p0": "Traceback ...\nZeroDivisionError: division by zero"})
    assert failure.kind is FailureKind.USER_CODE and not failure.retryable
    assert "p0" in failure.reason and "code 1" in failure.reason and failure.culprits == {}


def test_oom_and_segfault_are_user_code_sigkill_from_outside_is_not():
    assert classify([pod("p0", "a", 137, reason="OOMKilled")], NODES).kind is FailureKind.USER_CODE
    assert classify([pod("p0", "a", 139)], NODES).kind is FailureKind.USER_CODE
    assert classify([pod("p0", "a", 137)], NODES).kind is FailureKind.INFRASTRUCTURE


def test_failure_without_pods_is_infrastructure_unknown():
    failure = classify([], {})
    assert failure.kind is FailureKind.INFRASTRUCTURE and "no failed container" in failure.reason


def test_gpu_error_patterns():
    assert gpu_errors("NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error") == ["XID 48"]
    assert gpu_errors("Xid 79 on gpu 2") == ["XID 79"]
    assert gpu_errors("RuntimeError: CUDA error: uncorrectable ECC error encountered") != []
    assert gpu_errors("loss=1.23 step=100") == []


@pytest.mark.parametrize(
    ("problem", "code"),
    [
        ("XID 79 in pod train-a1-0 on gpu-node-003", "xid-79"),
        ("node not Ready (Unknown: NodeStatusUnknown)", "node-not-ready"),
        ("GPUHealthy=False: ecc_uncorrectable", "gpu-unhealthy"),
        ("the node object is gone (node deleted or lost)", "node-lost"),
        ("something else entirely", "training-failure"),
        (
            "GPUHealthy=False: quarantine: xid_fatal [gpu 0] fatal XID (reset/reboot): xid_events=[79]",
            "xid-79",
        ),
    ],
)
def test_quarantine_taint_value_is_a_short_code(problem, code):
    assert reason_code(problem) == code


def test_quarantine_taint_value_prefers_the_xid_whatever_was_seen_first():
    seen = "GPUHealthy=False: xid_fatal [gpu 0]; XID 79 in pod train-a1-0 on gpu-node-003"
    assert reason_code(seen) == "xid-79"
