"""``make up`` / ``make down``: bad input is refused without touching anything, every listener binds
loopback, and ``down`` stops everything, children included."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from trainops_devcluster import stack, stack_spec


def test_up_refuses_a_folder_that_is_not_a_stacks_and_leaves_it_alone(tmp_path, capsys):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")

    assert stack.main(["up", "--state-dir", str(tmp_path)]) == 1

    assert "--state-dir" in capsys.readouterr().err
    assert precious.read_text() == "keep me" and sorted(tmp_path.iterdir()) == [precious]


@pytest.mark.servers
def test_up_refuses_too_few_nodes_and_a_busy_api_port_before_starting_anything(tmp_path, capsys):
    state = tmp_path / "stack"
    assert stack.main(["up", "--state-dir", str(state), "--nodes", "2"]) == 1
    assert "--nodes 2" in capsys.readouterr().err

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert stack.main(["up", "--state-dir", str(state), "--api-port", str(port)]) == 1
    assert f"--api-port {port}" in capsys.readouterr().err
    assert not state.exists()


def test_down_with_nothing_running_says_so(tmp_path, capsys):
    assert stack.main(["down", "--state-dir", str(tmp_path / "never-started")]) == 0
    assert "nothing was running" in capsys.readouterr().out


def test_a_stack_recorded_by_an_older_version_is_not_taken_for_the_running_one(tmp_path):
    """Its endpoints lack a field this version has (``deploy``): ``up`` starts afresh, not a crash."""
    for folder in ("pids", "logs"):
        (tmp_path / folder).mkdir()
    stack._start(tmp_path, "devcluster", ["sleep", "600"])
    try:
        endpoints = asdict(stack_spec.COMPOSE)
        (tmp_path / "endpoints.json").write_text(json.dumps(endpoints))
        assert stack._running(tmp_path) == stack_spec.COMPOSE
        del endpoints["deploy"]
        (tmp_path / "endpoints.json").write_text(json.dumps(endpoints))
        assert stack._running(tmp_path) is None
    finally:
        assert stack.down(tmp_path) == ["devcluster"]


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _address(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (/proc/net/tcp, little-endian words) as ``("127.0.0.1", 8080)``."""
    host, port = hex_address.split(":")
    words = b"".join(bytes.fromhex(host[i : i + 8])[::-1] for i in range(0, len(host), 8))
    return str(ipaddress.ip_address(words)), int(port, 16)


def listening_sockets() -> dict[str, tuple[str, int]]:
    """Every listening TCP socket of this machine, by inode."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                found[fields[9]] = _address(fields[1])
    return found


def stack_listeners(state: Path) -> dict[str, set[tuple[str, int]]]:
    """The listening addresses of each service ``make up`` recorded, its descendants' included."""
    sockets, listeners = listening_sockets(), {}
    for record in sorted((state / "pids").glob("*.json")):
        entry = json.loads(record.read_text())
        for pid in [entry["pid"], *(d["pid"] for d in stack.descendants([entry]))]:
            for fd in Path(f"/proc/{pid}/fd").glob("*"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in sockets:
                        listeners.setdefault(record.stem, set()).add(sockets[target[8:-1]])
    return listeners


def test_every_listener_of_every_service_binds_loopback_only(services):
    """The README's "everything bound to 127.0.0.1": no socket of the stack is reachable from the network."""
    listeners = stack_listeners(services.state)

    assert {"airflow-apiserver", "airflow-scheduler", "postgres", "redis", "s3", "devcluster"} <= set(
        listeners
    )
    assert (services.at.api_bind, services.at.api_port) in listeners["airflow-apiserver"]
    assert ("127.0.0.1", services.at.scheduler_health_port) in listeners["airflow-scheduler"]
    exposed = {name: [a for a in addresses if a[0] not in LOOPBACK] for name, addresses in listeners.items()}
    assert {name: found for name, found in exposed.items() if found} == {}


def test_down_stops_every_process_the_stack_started_and_their_children(tmp_path, monkeypatch):
    """Children too: one in a session of its own that ignores SIGTERM (as the devcluster's trainer pods
    and the checkpoint reader have sessions of their own), and its child."""
    monkeypatch.setattr(stack, "STOP_TIMEOUT_S", 1.0)
    for folder in ("pids", "logs"):
        (tmp_path / folder).mkdir()
    pids = tmp_path / "pids.txt"
    spawn = (
        "import os, signal, subprocess, sys, time\n"
        "stubborn = ('import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '\n"
        '            \'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]); time.sleep(600)\')\n'
        "child = subprocess.Popen([sys.executable, '-c', stubborn], start_new_session=True)\n"
        "time.sleep(1)\n"
        f"open({str(pids)!r}, 'w').write(' '.join(map(str, [os.getpid(), child.pid])))\n"
        "time.sleep(600)\n"
    )
    stack._start(tmp_path, "devcluster", [sys.executable, "-c", spawn])
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    service, child = map(int, pids.read_text().split())
    tree = [
        {"pid": service, "start": stack._start_time(service)},
        *stack.descendants([{"pid": service, "start": stack._start_time(service)}]),
    ]
    assert {entry["pid"] for entry in tree} >= {service, child} and len(tree) == 3

    assert stack.down(tmp_path) == ["devcluster"]

    assert [entry["pid"] for entry in tree if stack._alive(entry)] == []
