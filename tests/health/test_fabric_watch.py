"""The probe reports a fabric link that went down (or came back) at once, not at its next interval: a
training run judging a crash waits for the node's own word, and a report every 60 s kept it waiting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from trainops_devcluster.probe_daemon import ProbeDaemon
from trainops_devcluster.store import Store
from trainops_devcluster.telemetry import NodeTelemetry

from tests.devcluster.ctrl_support import node, wait_for
from trainops.conventions import HEALTH_NAMESPACE
from trainops.health.ib_reader import SysfsIbReader
from trainops.health.probe import link_states, read_link_states, wait_for_next_sample


def sysfs(root: Path, state: str = "4: ACTIVE", phys_state: str = "5: LinkUp") -> Path:
    port = root / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True, exist_ok=True)
    for name, text in {"state": state, "phys_state": phys_state, "rate": "400 Gb/sec (4X NDR)"}.items():
        (port / name).write_text(text + "\n")
    (port / "link_layer").write_text("InfiniBand\n")
    return root


def test_a_link_going_down_between_samples_ends_the_wait_at_once(tmp_path):
    reader = SysfsIbReader(sysfs(tmp_path))
    before = read_link_states(reader)
    timer = threading.Timer(0.05, lambda: sysfs(tmp_path, "1: DOWN", "2: Polling"))
    timer.start()

    changed = wait_for_next_sample(threading.Event(), 3600, 0.01, reader, before)

    timer.join()
    assert changed
    assert read_link_states(reader) == {"mlx5_0/1": ("DOWN", "Polling")} != before


def test_unchanged_links_wait_out_the_interval_and_a_stop_ends_the_wait_without_a_sample(tmp_path):
    reader = SysfsIbReader(sysfs(tmp_path))
    before = read_link_states(reader)
    assert before == {"mlx5_0/1": ("ACTIVE", "LinkUp")}

    assert not wait_for_next_sample(threading.Event(), 0.05, 0.01, reader, before)
    stopped = threading.Event()
    stopped.set()
    assert not wait_for_next_sample(stopped, 3600, 0.01, reader, before)


def test_ports_that_vanish_while_read_are_no_links_not_a_crash(tmp_path):
    class Resetting:  # an adapter resetting: its port directory gone between the listing and the read
        def read_ports(self):
            raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "mlx5_0/ports/1/state"))

    assert read_link_states(Resetting()) == {}


def test_a_node_without_rdma_has_no_links_to_watch(tmp_path):
    reader = SysfsIbReader(tmp_path / "none")

    assert read_link_states(reader) == {}
    assert not wait_for_next_sample(threading.Event(), 0.05, 0.01, reader, {})


def gpu_healthy(store: Store, name: str) -> dict:
    conditions = store.get("nodes", "", name)["status"].get("conditions") or []
    return next(c for c in conditions if c["type"] == "GPUHealthy")


def healthy(store: Store, name: str) -> bool:
    return gpu_healthy(store, name)["status"] == "True"


def unhealthy(store: Store, name: str) -> str | None:
    condition = gpu_healthy(store, name)
    return condition["message"] if condition["status"] == "False" else None


@pytest.mark.parametrize("watch_s", [0.02, 0.0], ids=["watched", "not-watched"])
def test_the_devclusters_probe_publishes_a_downed_port_within_its_fabric_watch_not_its_interval(watch_s):
    """Its rounds every hour (none after the first), its fabric watch as the probe's --fabric-watch: the
    node's GPUHealthy condition turns False on the port going down only when the watch runs."""
    store, name = Store(), "gpu-node-000"
    store.create("nodes", node(name))
    store.create(
        "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HEALTH_NAMESPACE}}
    )
    telemetry = {name: NodeTelemetry.healthy(name)}
    daemon = ProbeDaemon(store, telemetry, interval_s=3600, gemm=False, fabric_watch_s=watch_s)
    daemon.start()
    try:
        daemon.wait_rounds(1)
        assert healthy(store, name)
        assert link_states(daemon.last_report(name).ib_ports)["mlx5_0/1"] == ("ACTIVE", "LinkUp")
        telemetry[name].ib_down(port=1)

        if watch_s:
            assert "ib_state" in wait_for(lambda: unhealthy(store, name), "GPUHealthy=False", timeout=30)
        else:
            threading.Event().wait(0.3)
            assert healthy(store, name)  # nothing reports it before the next round, an hour on
    finally:
        daemon.stop()
