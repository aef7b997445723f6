"""Fabric ports that matter: by link layer, by an NCCL_IB_HCA list, by the node's fabric label, at the
rate the cluster configures; a node without RDMA judged by its pool."""

from __future__ import annotations

import pytest
from trainops_devcluster import topology
from trainops_devcluster.hardware import parse_fleet
from trainops_devcluster.telemetry import FakeNvml, NodeTelemetry, TelemetryIbReader

from tests.health.conftest import Clock
from trainops.health.fabric import Fabric, Fabrics
from trainops.health.nvml_reader import NvmlReader
from trainops.health.policy import DEFAULT_POLICY, evaluate
from trainops.health.probe import collect_report
from trainops.health.stragglers import USABLE


def judged(spec: str, fabrics=None, label=None, change=lambda t: None, node_labels=None):
    """The verdict on a node of fleet entry ``spec`` (probed twice, ``change`` applied first) under the
    cluster's ``fabrics``; ``node_labels`` are added to the node object."""
    profile = parse_fleet(spec)[0]
    clock = Clock()
    telemetry = NodeTelemetry.from_profile("n", profile, clock=clock)
    change(telemetry)
    with NvmlReader(FakeNvml(telemetry), clock=clock) as reader:
        first = collect_report(reader, TelemetryIbReader(telemetry), "n", now=clock.now)
        clock.now += 60
        report = collect_report(reader, TelemetryIbReader(telemetry), "n", now=clock.now, previous=first)
    node = topology.gpu_node(0, profile)
    node["metadata"]["labels"].update(node_labels or {})
    policy = DEFAULT_POLICY.with_settings(fabrics, label)
    return evaluate(report, policy, now=clock.now, node=node)


def rows(verdict) -> set[str]:
    return {e["row"] for e in verdict.evidence if e["verdict"] == verdict.verdict != "ok"}


@pytest.mark.parametrize(
    ("hcas", "device", "port", "selected"),
    [
        ("", "mlx5_8", 1, True),
        ("mlx5_0,mlx5_1", "mlx5_1", 1, True),
        ("mlx5_0,mlx5_1", "mlx5_10", 1, True),  # names are prefixes, as NCCL reads them
        ("=mlx5_1", "mlx5_10", 1, False),  # '=': exact names
        ("mlx5_0:1", "mlx5_0", 2, False),  # ':N': that port only
        ("^mlx5_8,mlx5_9", "mlx5_8", 1, False),  # '^': all but these
        ("^mlx5_8,mlx5_9", "mlx5_3", 1, True),
        ("^=mlx5_1", "mlx5_10", 1, True),
    ],
)
def test_hca_lists_select_ports_as_nccl_ib_hca_does(hcas, device, port, selected):
    assert Fabric("f", hcas=hcas).selects(device, port) is selected


def test_an_ethernet_mode_nic_beside_infiniband_is_not_judged():
    def storage_port_down(telemetry):
        telemetry.ib_down(device="mlx5_8")

    verdict = judged("h100-sxm/ib-ndr+eth", change=storage_port_down)
    assert verdict.verdict in USABLE, verdict.reasons
    assert any("mlx5_8/1" in line and "Ethernet link layer" in line for line in verdict.not_applicable)


def test_roce_with_a_storage_nic_needs_its_hca_list():
    undescribed = judged("l40s/roce-200+eth")  # mlx5_9, an unused storage port, is down; mlx5_8 runs at 100
    assert undescribed.verdict == "exclude", undescribed.reasons  # never quarantined for it
    assert rows(undescribed) == {"ib_state", "ib_phys_state", "ib_rate"}
    assert "Name the fabric's HCAs as NCCL_IB_HCA does" in undescribed.reasons[0]
    roce = {"roce": {"link_layer": "Ethernet", "hcas": "^mlx5_8,mlx5_9"}}
    verdict = judged("l40s/roce-200+eth", roce, node_labels={"trainops.io/fabric": "roce"})
    assert verdict.verdict in USABLE, verdict.reasons
    assert any("not in its HCA list" in line for line in verdict.not_applicable)


def test_a_roce_port_down_is_a_fault_once_the_fabric_is_described():
    def down(telemetry):
        telemetry.ib_down(device="mlx5_2")

    assert judged("l40s/roce-200", change=down).verdict == "exclude"
    described = judged("l40s/roce-200", {"default": {"link_layer": "Ethernet"}}, change=down)
    assert described.verdict == "quarantine" and rows(described) == {"ib_state", "ib_phys_state"}


def test_the_expected_rate_comes_from_the_clusters_fabric_never_a_fixed_400():
    assert judged("a100-sxm/ib-hdr").verdict in USABLE  # HDR at 200 Gb/s is healthy
    assert judged("a100-sxm/ib-hdr", {"default": {"rate_gbps": 200}}).verdict in USABLE
    slow = judged("a100-sxm/ib-hdr", {"default": {"rate_gbps": 400}})  # every port trained at half
    assert slow.verdict == "exclude" and rows(slow) == {"ib_rate"}
    assert "ib_rate_shortfall_gbps=200.0" in slow.reasons[0]


def test_a_node_without_rdma_is_judged_by_its_pool():
    training_pool = judged("l4/none")
    assert training_pool.verdict == "exclude" and rows(training_pool) == {"ib_port_count"}
    assert "label it trainops.io/fabric=none" in training_pool.reasons[0]
    assert judged("l4:pool=none/none").verdict in USABLE
    single_node = judged("l4/none", {"default": {"required": False}})  # a cluster that trains on one node
    assert single_node.verdict in USABLE
    assert any("needs no RDMA" in line for line in single_node.not_applicable)


def test_a_label_naming_an_unknown_fabric_excludes_naming_the_fix():
    verdict = judged("h100-sxm/ib-ndr", node_labels={"pool/fabric": "ndr"}, label="pool/fabric")
    assert verdict.verdict == "exclude"
    assert (
        "names no fabric the gate knows (default, none): add it to the gate's fabrics" in verdict.reasons[0]
    )
    assert (
        judged(
            "h100-sxm/ib-ndr", {"ndr": {"rate_gbps": 400}}, "pool/fabric", node_labels={"pool/fabric": "ndr"}
        ).verdict
        in USABLE
    )


def test_fewer_fabric_ports_than_the_fabric_has():
    verdict = judged("h100-sxm/ib-ndr", {"default": {"ports": 9}})
    assert verdict.verdict == "exclude" and rows(verdict) == {"ib_ports_missing"}


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            {"roce": {"link_layer": "ethernet"}},
            "fabric 'roce': link_layer must be one of auto, InfiniBand, Ethernet",
        ),
        ({"roce": {"rate_gbps": "fast"}}, "fabric 'roce': rate_gbps must be a positive number of Gb/s"),
        ({"roce": {"hcas": "mlx5_0;mlx5_1"}}, "fabric 'roce': hcas must be an NCCL_IB_HCA list"),
        ({"roce": {"speed": 400}}, "fabrics['roce']: unknown setting(s) speed"),
        ({"roce": {"ports": 0}}, "fabric 'roce': ports must be an integer >= 1"),
        ({"Not A Label": {}}, "fabrics: 'Not A Label' is not a label value"),
        (["default"], "fabrics: expected a mapping of fabric name -> settings"),
    ],
)
def test_bad_fabric_settings_name_the_field(specs, message):
    with pytest.raises(ValueError) as raised:
        Fabrics.from_mapping(specs)
    assert message in str(raised.value)
