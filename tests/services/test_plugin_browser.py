"""The UI plugin in headless Chromium against the real API server of the services stack: an
anonymous visitor gets no data; after logging in through Airflow's own login page, the fleet view
shows the node quarantined after an injected XID, with its reason, and releases it after repair
(with the typed confirmation); the train task's extra link opens the run view. Screenshots are kept under a
folder printed in the test log."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import requests
from kubernetes import client
from trainops.plugins.actions import ACTION_ANNOTATION
from trainops_devcluster.stack_spec import ADMIN_USER, BUCKET, DEFAULT_ADMIN_PASSWORD

from tests.plugins.chromium import Browser
from tests.services.conftest import TERMINAL, trainer, wait_for
from trainops.conventions import QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.quarantine import apply_quarantine
from trainops.kube.retry import Deadline

NODE = "gpu-node-007"
DAG_ID = "training_lifecycle"
FILTER = "(() => { const f = document.getElementById('filter'); f.value = '%s'; f.dispatchEvent(new Event('input')); return true; })()"


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


def test_the_train_task_links_to_a_run_view_with_its_attempts_and_checkpoint(services, airflow, browser):
    api = f"http://127.0.0.1:{services.at.api_port}"
    airflow.unpause(DAG_ID)
    answer = airflow.trigger(DAG_ID, "ui-run", {"run_name": "ui-run", "command": trainer(20, 0.05)})
    assert answer.status_code == 200, answer.text
    airflow.follow(DAG_ID, "ui-run", lambda run, _: run["state"] in TERMINAL)
    assert airflow.run(DAG_ID, "ui-run")["state"] == "success"
    links = airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/ui-run/taskInstances/train/links")["extra_links"]
    assert links == {"Training run": f"/trainops/runs/{DAG_ID}/ui-run"}

    log_in(browser, api)
    browser.open(api + links["Training run"])
    rows = browser.wait_for(
        "document.querySelectorAll('#attempts tbody tr').length && [...document.querySelectorAll('#attempts tbody tr')].map(r => r.innerText)"
    )
    assert len(rows) == 1 and "fresh start" in rows[0] and "succeeded" in rows[0]
    latest = browser.wait_for("document.getElementById('latest').innerText")
    assert f"s3://{BUCKET}/runs/ui-run/step-20/" in latest and "step 20" in latest
    capacity = browser.eval("document.getElementById('capacity').innerText")
    assert capacity.startswith("Claimed: gpu-node-") and "Returned: gpu-node-" in capacity
    browser.screenshot("run-view")
