"""The gate on a devcluster of mixed hardware: healthy nodes of every family are selected, faulty
ones are kept out for the right reason (the node probe daemon publishing, the gate reading the API)."""

from __future__ import annotations

import pynvml
from kubernetes import client, config

from trainops.health.gate import GateConfig, run_gate
from trainops.health.stragglers import USABLE

FLEET = (
    "2*h100-sxm/ib-ndr, h200-sxm/ib-ndr, b200/ib-ndr, 2*a100-sxm/ib-hdr+eth, 2*l40s/roce-200, "
    "2*h100-nvl/roce-400, h100-pcie:bridge=on/ib-hdr, a100-sxm:mig=1g.10gb:pool=none/none, "
    "2*t4:pool=none/none, 2*v100-sxm2/roce-100, l4:pool=none/none"
)


def test_healthy_nodes_of_every_family_are_selected_and_faulty_ones_kept_out_for_the_right_reason(
    make_devcluster,
):
    cluster = make_devcluster(fleet=FLEET)
    names = sorted(cluster.telemetry)
    by_gpu = {}
    for name in names:
        by_gpu.setdefault(cluster.telemetry[name].profile.gpu, []).append(name)
    faults = {  # node -> (fault, the row that must keep it out, the verdict)
        by_gpu["h100-sxm"][1]: (lambda t: t.nvlink_down(gpu=2, link=7), "nvlink_down", "quarantine"),
        by_gpu["l40s"][1]: (lambda t: t.inject_xid(79, gpu=0), "xid_fatal", "quarantine"),
        by_gpu["a100-sxm"][2]: (lambda t: t.mig_device_lost(gpu=5), "gpus_missing", "quarantine"),
        by_gpu["t4"][0]: (lambda t: t.retire_pages(2, gpu=1, pending=True), "retired_pending", "quarantine"),
        by_gpu["h100-nvl"][0]: (
            lambda t: t.ib_rate("200 Gb/sec (4X HDR)", device="mlx5_4"),
            "ib_rate",
            "exclude",
        ),
        by_gpu["v100-sxm2"][0]: (
            lambda t: t.set_nvml_init_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
            "gpu_count",
            "exclude",
        ),
    }
    cluster.probe_daemon.wait_rounds(1)
    for name, (inject, _, _) in faults.items():
        inject(cluster.telemetry[name])
    cluster.telemetry[by_gpu["a100-sxm"][0]].ib_down(device="mlx5_9")  # the unused storage port: no matter
    cluster.probe_daemon.wait_rounds(2)

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    result = run_gate(client.CoreV1Api(api), GateConfig(speed_tiers=False))
    verdicts = {n.name: n for n in result.nodes}

    healthy = [name for name in names if name not in faults]
    assert {cluster.telemetry[n].profile.gpu for n in healthy} == set(by_gpu)  # every family
    for name in healthy:
        assert verdicts[name].verdict in USABLE, (
            cluster.telemetry[name].profile.describe(),
            verdicts[name].reasons,
        )
    assert sorted(result.selected) == healthy
    for name, (_, row, verdict) in faults.items():
        node = verdicts[name]
        assert node.verdict == verdict, (name, node.reasons)
        assert any(reason.startswith(f"{row} [") for reason in node.reasons), node.reasons
    no_driver = verdicts[by_gpu["v100-sxm2"][0]].reasons
    assert any("runtimeClassName: nvidia" in reason for reason in no_driver)  # the gate names the fix
    unbridged = result.to_dict()["nodes"][names.index(by_gpu["l40s"][0])]["not_applicable"]
    assert any("has no NVLink" in line for line in unbridged)
