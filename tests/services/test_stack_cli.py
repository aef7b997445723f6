"""``make up`` / ``make down`` refuse bad input without touching anything."""

from __future__ import annotations

import json
import socket
from dataclasses import asdict

from trainops_devcluster import stack, stack_spec


def test_up_refuses_a_folder_that_is_not_a_stacks_and_leaves_it_alone(tmp_path, capsys):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")

    assert stack.main(["up", "--state-dir", str(tmp_path)]) == 1

    assert "--state-dir" in capsys.readouterr().err
    assert precious.read_text() == "keep me" and sorted(tmp_path.iterdir()) == [precious]


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
