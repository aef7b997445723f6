"""The UI plugin in headless Chromium against the real API server of the services stack: an
anonymous visitor gets no data; after logging in through Airflow's own login page, the fleet view
shows the node quarantined after an injected XID, with its reason, and releases it after repair
(with the typed confirmation); the train task's extra link opens the run view of a run resumed after
an XID (attempts, culprit, heartbeat rate, the plot with its resume marker), whose GPUs the user gives
back with a typed confirmation. Screenshots are kept under a folder printed in the test log."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from kubernetes import client
from trainops.plugins.actions import ACTION_ANNOTATION
from trainops_devcluster.stack_spec import ADMIN_USER, BUCKET, DEFAULT_ADMIN_PASSWORD

from tests.plugins.chromium import Browser
from tests.services.conftest import TERMINAL, trainer, wait_for
from tests.training.conftest import heartbeat_step
from trainops.conventions import CLAIMED_BY_ANNOTATION, GPU_RESOURCE, MODE_TAINT, QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.quarantine import apply_quarantine
from trainops.kube.retry import Deadline
from trainops.training.job import ATTEMPT_LABEL, RUN_LABEL
from trainops.training.naming import run_key

NODE = "gpu-node-007"
DAG_ID = "training_lifecycle"
RUN_ID = "ui-run"
FILTER = "(() => { const f = document.getElementById('filter'); f.value = '%s'; f.dispatchEvent(new Event('input')); return true; })()"


def running_pods(kube, attempt: str) -> list:
    """The running training pods of RUN_ID's attempt ``attempt`` (by the labels its Job gives them)."""
    selector = f"{RUN_LABEL}={run_key(DAG_ID, RUN_ID)},{ATTEMPT_LABEL}={attempt}"
    pods = client.CoreV1Api(kube).list_namespaced_pod("training", label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running"]


def log_in(browser: Browser, api: str) -> None:
    """Through Airflow's own login page, typing as a person does; it stores the session cookie and
    goes on to the fleet view."""
    browser.open(f"{api}/auth/login/?next=/trainops/fleet")
    browser.wait_for("document.querySelector('input[type=password]') !== null")
    browser.type_into("input:not([type=password])", ADMIN_USER)
    browser.type_into("input[type=password]", DEFAULT_ADMIN_PASSWORD)
    browser.eval("document.querySelector('button[type=submit]').click(), true")
    browser.wait_for("location.pathname === '/trainops/fleet' && document.readyState === 'complete'")
    assert browser.eval("document.cookie.includes('_token=')")
    browser.screenshot("logged-in")


@pytest.fixture
def browser():
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is missing: run scripts/install-system-packages (make setup)")
    artifacts = Path(tempfile.mkdtemp(prefix="trainops-ui-screenshots-"))
    print(f"\nUI screenshots and chromium log in {artifacts}")
    running = Browser(artifacts)
    yield running
    running.close()


def test_the_fleet_view_shows_an_xid_quarantine_after_login_and_nothing_before(services, browser):
    api = f"http://127.0.0.1:{services.at.api_port}"
    core = client.CoreV1Api(services.kube())
    injected = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/xid", json={"target": NODE, "code": 79}, timeout=30
    )
    assert injected.status_code == 200, injected.text
    one = GateConfig(node_names=(NODE,), speed_tiers=False)
    wait_for(
        lambda: run_gate(core, one).nodes[0].policy.verdict == "quarantine",
        f"{NODE}'s probe to report the XID",
    )
    assert apply_quarantine(core, run_gate(core, one), Deadline(30)) == [NODE]

    browser.open(f"{api}/trainops/fleet")
    assert "Not logged in to Airflow (401)" in browser.wait_for("document.getElementById('error').innerText")
    assert browser.eval("document.querySelectorAll('#fleet tbody tr').length") == 0
    browser.screenshot("anonymous")

    log_in(browser, api)

    browser.open(f"{api}/trainops/fleet")
    row = f"document.querySelector('tr[data-node=\"{NODE}\"]')"
    text = browser.wait_for(f"{row} && {row}.innerText")
    assert "gpu_lost.xid_fatal" in text and "quarantine" in text
    # The API server's [trainops] prometheus_conn_id names the stack's Prometheus: the tensor-core
    # column has the node's dcgm-exporter value (quarantined, it trains nothing: 0%), and no note.
    tensor = f"{row}.querySelector('td.tensor').innerText"
    assert browser.wait_for(f"{tensor}.endsWith('%') && {tensor}") == "0%"
    assert browser.eval("document.getElementById('notes').innerText") == ""
    assert browser.eval("document.querySelectorAll('#fleet tbody tr').length") == services.at.devcluster_nodes
    quarantined = [
        n for n in core.list_node().items if any(t.key == QUARANTINE_TAINT for t in n.spec.taints or [])
    ]
    assert f"quarantined {len(quarantined)}" in browser.eval("document.getElementById('counts').innerText")
    browser.screenshot("fleet")

    browser.eval(FILTER % "xid")
    assert browser.eval("[...document.querySelectorAll('#fleet tbody tr')].map(r => r.dataset.node)") == [
        NODE
    ]
    browser.screenshot("fleet-filtered")

    # Repaired: the probe reports it healthy; the Release button re-checks it and lifts the quarantine.
    repaired = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/repair", json={"target": NODE}, timeout=30
    )
    assert repaired.status_code == 200, repaired.text
    wait_for(
        lambda: run_gate(core, one).nodes[0].policy.verdict in ("ok", "warn"),
        f"{NODE}'s probe to report it repaired",
    )
    asked = browser.click_and_answer_prompt(f"button.release[data-node='{NODE}']", NODE)
    assert asked.startswith(f"Re-check {NODE} and release it")
    browser.wait_for(f"!document.querySelector(\"button.release[data-node='{NODE}']\")")
    browser.eval(FILTER % "")
    text = browser.wait_for(f"{row} && {row}.innerText")
    assert "gpu_lost" not in text and "Release" not in text
    assert browser.eval("document.getElementById('error').innerText") == ""
    browser.screenshot("fleet-released")
    node = core.read_node(NODE)
    assert not any(t.key == QUARANTINE_TAINT for t in node.spec.taints or [])
    record = json.loads(node.metadata.annotations[ACTION_ANNOTATION])
    assert record["who"] == ADMIN_USER and record["what"].startswith("released from quarantine")


def test_the_run_view_shows_the_resume_on_its_plot_and_gives_the_run_gpus_back(services, airflow, browser):
    """A run resumed after an XID, whose teardown an operator marked success by hand before it ran, so
    the run still holds its nodes: the train task's extra link opens the run view with both attempts,
    the culprit, the heartbeat and its rate and the plot with its resume; "Return this run's GPUs"
    asks for the typed run name, gives the nodes back and records who did it on each."""
    api = f"http://127.0.0.1:{services.at.api_port}"
    run = f"{DAG_ID}/{RUN_ID}"
    run_uri = f"s3://{BUCKET}/runs/{RUN_ID}/"
    kube = services.kube()
    airflow.unpause(DAG_ID)
    answer = airflow.trigger(DAG_ID, RUN_ID, {"run_name": RUN_ID, "command": trainer(200, 0.05)})
    assert answer.status_code == 200, answer.text
    marked = airflow.ok(
        "PATCH",
        f"/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances/return_capacity",
        json={"new_state": "success"},
    )
    assert marked["task_instances"][0]["state"] == "success"
    wait_for(
        lambda: (
            airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances/train")["state"] == "deferred"
            and heartbeat_step(services.s3, run_uri) >= 25
            and running_pods(kube, "1")
        ),
        "attempt 1 followed by the triggerer and past its step-20 checkpoint",
    )
    culprit = running_pods(kube, "1")[0].spec.node_name
    injected = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/xid",
        json={"target": culprit, "code": 79},
        timeout=30,
    )
    assert injected.status_code == 200, injected.text
    airflow.follow(DAG_ID, RUN_ID, lambda run, _: run["state"] in TERMINAL)
    assert airflow.run(DAG_ID, RUN_ID)["state"] == "success"
    links = airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances/train/links")["extra_links"]
    assert links == {"Training run": f"/trainops/runs/{DAG_ID}/{RUN_ID}"}
    holding = [
        n
        for n in client.CoreV1Api(kube).list_node().items
        if (n.metadata.annotations or {}).get(CLAIMED_BY_ANNOTATION) == run
    ]
    held = sorted(n.metadata.name for n in holding)
    gpus = sum(int(n.status.allocatable[GPU_RESOURCE]) for n in holding)
    assert culprit in held and len(held) == 3  # two trained, one spare took the culprit's place

    log_in(browser, api)
    browser.open(api + links["Training run"])
    rows = browser.wait_for(
        "document.querySelectorAll('#attempts tbody tr').length && [...document.querySelectorAll('#attempts tbody tr')].map(r => r.innerText)"
    )
    assert len(rows) == 2 and "fresh start" in rows[0] and culprit in rows[0] and "infrastructure" in rows[0]
    assert f"{run_uri}step-" in rows[1] and "succeeded" in rows[1]
    heartbeat = browser.wait_for("document.getElementById('heartbeat').innerText")
    assert re.search(
        r"Heartbeat: step 200 at .* \d+\.\d\d steps/s since checkpoint step \d+ committed", heartbeat
    ), heartbeat
    plot = "document.querySelector('#plot svg#progress-plot')"
    assert browser.eval(f"{plot} !== null && {plot}.querySelectorAll('polyline.series').length") == 2
    assert browser.eval(f"[...{plot}.querySelectorAll('.marker.resume')].map(m => m.dataset.attempt)") == [
        "2"
    ]
    crash = browser.eval(f"[...{plot}.querySelectorAll('.marker.crash')].map(m => m.textContent)")
    assert len(crash) == 1 and f"culprit {culprit}" in crash[0]
    latest = browser.eval("document.getElementById('latest').innerText")
    assert f"{run_uri}step-200/" in latest
    capacity = browser.eval("document.getElementById('capacity').innerText")
    assert capacity.startswith("Claimed: gpu-node-") and "Not returned yet." in capacity
    browser.screenshot("run-view")

    clicked = datetime.now(UTC).replace(microsecond=0)
    asked = browser.click_and_answer_prompt("#return", run)
    assert asked == f"Return every GPU node and inference loan of {run}? Type {run} to confirm."
    returned = browser.wait_for("document.getElementById('returned').innerText")
    assert returned.startswith(f"You returned {', '.join(held)} ({gpus} GPUs; "), returned
    assert "GPUs of quota taken back" in returned, returned
    assert f"still quarantined: {culprit}" in returned
    assert browser.eval("document.getElementById('error').innerText") == ""
    browser.eval("document.getElementById('capacity').scrollIntoView(), true")
    browser.screenshot("run-returned")
    for name in held:
        node = client.CoreV1Api(kube).read_node(name)
        assert CLAIMED_BY_ANNOTATION not in (node.metadata.annotations or {})
        assert {t.key: t.value for t in node.spec.taints}[MODE_TAINT] == "inference"
        record = json.loads(node.metadata.annotations[ACTION_ANNOTATION])
        assert record == {
            "who": ADMIN_USER,
            "when": record["when"],
            "what": f"capacity of run {run} returned",
        }
        assert clicked <= datetime.fromisoformat(record["when"]) <= datetime.now(UTC)
