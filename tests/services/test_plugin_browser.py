"""The UI plugin in headless Chromium against the real API server of the services stack: an
anonymous visitor gets no data; after logging in through Airflow's own login page, the fleet view
shows the node quarantined after an injected XID, with its reason. Screenshots are kept under a
folder printed in the test log."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import requests
from kubernetes import client
from trainops_devcluster.stack_spec import ADMIN_USER, DEFAULT_ADMIN_PASSWORD

from tests.plugins.chromium import Browser
from tests.services.conftest import wait_for
from trainops.conventions import QUARANTINE_TAINT
from trainops.health.gate import GateConfig, run_gate
from trainops.health.quarantine import apply_quarantine
from trainops.kube.retry import Deadline

NODE = "gpu-node-007"


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
    browser.screenshot("1-anonymous")

    browser.open(f"{api}/auth/login/?next={api}/trainops/fleet")
    browser.wait_for("document.querySelector('input[type=password]') !== null")
    browser.type_into("input:not([type=password])", ADMIN_USER)  # real key input, as a person types
    browser.type_into("input[type=password]", DEFAULT_ADMIN_PASSWORD)
    browser.eval("document.querySelector('button[type=submit]').click(), true")
    browser.wait_for("document.cookie.includes('_token=') || location.pathname.startsWith('/trainops')")
    browser.screenshot("2-logged-in")

    browser.open(f"{api}/trainops/fleet")
    row = f"document.querySelector('tr[data-node=\"{NODE}\"]')"
    text = browser.wait_for(f"{row} && {row}.innerText")
    assert "gpu_lost.xid_fatal" in text and "quarantine" in text
    assert browser.eval("document.querySelectorAll('#fleet tbody tr').length") == services.at.devcluster_nodes
    quarantined = [
        n for n in core.list_node().items if any(t.key == QUARANTINE_TAINT for t in n.spec.taints or [])
    ]
    assert f"quarantined {len(quarantined)}" in browser.eval("document.getElementById('counts').innerText")
    browser.screenshot("3-fleet")

    browser.eval(
        "(() => { const f = document.getElementById('filter'); f.value = 'xid'; f.dispatchEvent(new Event('input')); return true; })()"
    )
    assert browser.eval("[...document.querySelectorAll('#fleet tbody tr')].map(r => r.dataset.node)") == [
        NODE
    ]
    browser.screenshot("4-fleet-filtered")
