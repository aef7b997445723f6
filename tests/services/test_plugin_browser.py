"""The UI plugin in headless Chromium against the real API server of the services stack, inside the
Airflow UI as its React apps (no iframes): after logging in through Airflow's own login page, the
fleet page of the idle cluster shows nothing that needs a person, in the UI's light and dark colour
modes; after an injected XID it shows the node quarantined, with its reason and since when in the
timezone chosen in the UI's user menu, and releases it after repair (with the typed confirmation);
the train task's extra link opens the Training run tab of a run resumed after an XID (attempts,
culprit, heartbeat rate, the plot with its resume marker), whose nodes link back to it from the fleet
and whose GPUs the user gives back with a typed confirmation. Screenshots are kept under
``artifacts/ui-screenshots/`` (``TRAINOPS_ARTIFACTS`` names another folder), printed in the test log."""

from __future__ import annotations

import json
import os
import re
import shutil
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
FLEET = "/plugin/trainops-fleet"
ARTIFACTS = (
    Path(os.environ.get("TRAINOPS_ARTIFACTS") or Path(__file__).parents[2] / "artifacts") / "ui-screenshots"
)
ROWS = "[...document.querySelectorAll('#fleet tbody tr')]"
# Luminance (0 black - 1 white) of the page behind the fleet table and of the table's text, whatever
# the notation of the UI's colours (its theme writes oklch): each is painted on a 1x1 canvas and read back.
LUMINANCE = (
    "(() => { const c = document.createElement('canvas').getContext('2d'); const lum = (css) => {"
    " c.clearRect(0, 0, 1, 1); c.fillStyle = css; c.fillRect(0, 0, 1, 1); const [r, g, b] = c.getImageData(0, 0, 1, 1).data;"
    " return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255; };"
    " let e = document.getElementById('fleet');"
    " while (e && getComputedStyle(e).backgroundColor === 'rgba(0, 0, 0, 0)') e = e.parentElement;"
    " return {page: lum(getComputedStyle(e || document.body).backgroundColor),"
    " text: lum(getComputedStyle(document.querySelector('#fleet tbody td')).color)}; })()"
)


def running_pods(kube, attempt: str) -> list:
    """The running training pods of RUN_ID's attempt ``attempt`` (by the labels its Job gives them)."""
    selector = f"{RUN_LABEL}={run_key(DAG_ID, RUN_ID)},{ATTEMPT_LABEL}={attempt}"
    pods = client.CoreV1Api(kube).list_namespaced_pod("training", label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running"]


def log_in(browser: Browser, api: str, then: str = FLEET) -> None:
    """Through Airflow's own login page, typing as a person does; it stores the session cookie and
    goes on to ``then``, a page of the UI."""
    browser.open(f"{api}/auth/login/?next={then}")
    browser.wait_for("document.querySelector('input[type=password]') !== null")
    browser.type_into("input:not([type=password])", ADMIN_USER)
    browser.type_into("input[type=password]", DEFAULT_ADMIN_PASSWORD)
    browser.eval("document.querySelector('button[type=submit]').click(), true")
    browser.wait_for(f"location.pathname === {json.dumps(then)} && document.readyState === 'complete'")
    assert browser.eval("document.cookie.includes('_token=')")


def open_fleet(browser: Browser, api: str) -> None:
    browser.open(f"{api}{FLEET}")
    browser.wait_for(f"{ROWS}.length > 0 && document.getElementById('counts') !== null")


def confirm(browser: Browser, typed: str) -> str:
    """Type ``typed`` into the open confirmation dialog and confirm; returns what the dialog asked."""
    asked = browser.wait_for(
        "document.querySelector('#confirm-input') && document.querySelector('[data-testid=confirm-dialog]').innerText"
    )
    browser.fill("#confirm-input", typed)
    browser.wait_for("!document.getElementById('confirm-button').disabled")
    browser.click("#confirm-button")
    return asked


@pytest.fixture
def browser():
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is missing: run scripts/install-system-packages (make setup)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots and chromium log in {ARTIFACTS}")
    running = Browser(ARTIFACTS)
    yield running
    running.close()


def test_the_fleet_page_of_the_ui_needs_nobody_when_idle_and_shows_an_xid_quarantine(services, browser):
    api = f"http://127.0.0.1:{services.at.api_port}"
    core = client.CoreV1Api(services.kube())
    assert requests.get(f"{api}/trainops/api/fleet", timeout=30).status_code == 401  # no login, no data

    log_in(browser, api)
    open_fleet(browser, api)
    # The idle cluster: inference nodes busy serving are serving, not warnings; nothing needs a person.
    statuses = browser.eval(f"{ROWS}.map(r => r.dataset.status)")
    assert len(statuses) == services.at.devcluster_nodes and set(statuses) == {"serving"}, statuses
    assert browser.eval("document.querySelector('[data-attention]').dataset.attention") == "0"
    assert "nothing needs attention" in browser.eval("document.getElementById('counts').innerText")
    assert browser.eval(f"{ROWS}.every(r => !r.querySelector('.findings .attention'))")
    row = f"document.querySelector('tr[data-node=\"{NODE}\"]')"
    assert "NVIDIA-H100-80GB-HBM3" in browser.eval(f"{row}.innerText")  # the GPU model column
    assert browser.eval("document.documentElement.classList.contains('dark')") is False
    light = browser.eval(LUMINANCE)
    browser.screenshot("fleet-idle")
    browser.eval("localStorage.setItem('theme', 'dark'), true")  # what the UI's colour-mode switch stores
    open_fleet(browser, api)
    assert browser.eval("document.documentElement.classList.contains('dark')") is True
    dark = browser.eval(LUMINANCE)
    assert light["page"] > 0.8 > 0.3 > dark["page"] and dark["text"] > 0.6  # the page follows the UI's mode
    browser.screenshot("fleet-idle-dark")
    browser.eval("localStorage.setItem('theme', 'light'), true")

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
    # The timezone chosen in the UI's user menu is the one the page writes times in.
    browser.eval("localStorage.setItem('timezone', JSON.stringify('Asia/Tokyo')), true")
    open_fleet(browser, api)
    text = browser.wait_for(f"{row} && {row}.dataset.status === 'quarantined' && {row}.innerText")
    assert "gpu_lost.xid_fatal" in text and "fatal XID" in text
    assert re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+09:00", text), text
    # The API server's [trainops] prometheus_conn_id names the stack's Prometheus: the tensor-core
    # column has the mean of the node's dcgm-exporter series as that Prometheus holds them (its
    # inference pods still hold the GPUs the XID spared), and no note.
    tensor = f"{row}.querySelector('td.tensor').innerText"
    shown = browser.wait_for(f"{tensor}.endsWith('%') && {tensor}")
    held = requests.get(
        f"http://127.0.0.1:{services.at.prometheus_port}/api/v1/query",
        params={"query": f'avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{NODE}"}})'},
        timeout=30,
    ).json()["data"]["result"]
    assert shown == f"{float(held[0]['value'][1]) * 100:.0f}%", (shown, held)
    assert browser.eval("document.getElementById('notes').innerText") == ""
    counts = browser.eval("document.getElementById('counts').innerText")
    assert "1 needs attention" in counts and "quarantined 1" in counts
    assert browser.eval(f"{ROWS}[0].dataset.node") == NODE  # what needs a person comes first
    browser.screenshot("fleet")
    browser.eval("localStorage.removeItem('timezone'), true")

    browser.fill("#filter", "xid")
    browser.wait_for(f"{ROWS}.length === 1")
    assert browser.eval(f"{ROWS}.map(r => r.dataset.node)") == [NODE]
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
    browser.click(f"button.release[data-node='{NODE}']")
    asked = confirm(browser, NODE)
    assert f"Re-check {NODE} and release it" in asked
    browser.wait_for(f"!document.querySelector(\"button.release[data-node='{NODE}']\")")
    browser.fill("#filter", "")
    text = browser.wait_for(f"{row} && {row}.dataset.status !== 'quarantined' && {row}.innerText")
    assert "gpu_lost" not in text and "Release" not in text
    assert browser.eval("document.getElementById('error')") is None
    browser.screenshot("fleet-released")
    node = core.read_node(NODE)
    assert not any(t.key == QUARANTINE_TAINT for t in node.spec.taints or [])
    record = json.loads(node.metadata.annotations[ACTION_ANNOTATION])
    assert record["who"] == ADMIN_USER and record["what"].startswith("released from quarantine")


def test_the_run_view_shows_the_resume_on_its_plot_and_gives_the_run_gpus_back(services, airflow, browser):
    """A run resumed after an XID, whose teardown an operator marked success by hand before it ran, so
    the run still holds its nodes: the train task's extra link opens the run's Training run tab with
    both attempts, the culprit, the heartbeat and its rate and the plot with its resume; the fleet links
    the run's nodes back to the DAG run and its tab; "Return this run's GPUs" asks for the typed run
    name, gives the nodes back and records who did it on each."""
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
    tab = f"/dags/{DAG_ID}/runs/{RUN_ID}/plugin/trainops-run"
    assert links == {"Training run": tab}
    holding = [
        n
        for n in client.CoreV1Api(kube).list_node().items
        if (n.metadata.annotations or {}).get(CLAIMED_BY_ANNOTATION) == run
    ]
    held = sorted(n.metadata.name for n in holding)
    gpus = sum(int(n.status.allocatable[GPU_RESOURCE]) for n in holding)
    assert culprit in held and len(held) == 3  # two trained, one spare took the culprit's place

    log_in(browser, api)
    # The fleet: each node the run holds links back to the DAG run, and to its Training run tab.
    open_fleet(browser, api)
    trained = next(name for name in held if name != culprit)
    held_row = f"document.querySelector('tr[data-node=\"{trained}\"]')"
    assert browser.eval(f"{held_row}.dataset.status") == "training"
    hrefs = browser.eval(f"[...{held_row}.querySelectorAll('a')].map(a => new URL(a.href).pathname)")
    assert hrefs == [f"/dags/{DAG_ID}/runs/{RUN_ID}", tab], hrefs
    browser.eval(f"{held_row}.querySelector('a').click(), true")  # the UI's router: no page load
    browser.wait_for(f"location.pathname === '/dags/{DAG_ID}/runs/{RUN_ID}'")
    browser.open(api + links["Training run"])
    rows = browser.wait_for(
        "document.querySelectorAll('#attempts tbody tr').length && [...document.querySelectorAll('#attempts tbody tr')].map(r => r.innerText)"
    )
    assert len(rows) == 2 and "fresh start" in rows[0] and culprit in rows[0] and "infrastructure" in rows[0]
    assert f"{run_uri}step-" in rows[1] and "succeeded" in rows[1]
    heartbeat = browser.wait_for("document.getElementById('heartbeat').innerText")
    assert re.search(
        r"Heartbeat: step 200 at .*, \d+\.\d steps/s since the step-\d+ checkpoint \(", heartbeat
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
    browser.click("#return")
    asked = confirm(browser, run)
    assert f"Return every GPU node and inference loan of {run}? Type {run} to confirm." in asked
    returned = browser.wait_for(
        "document.getElementById('returned') && document.getElementById('returned').innerText"
    )
    assert returned.startswith(f"You returned {', '.join(held)} ({gpus} GPUs; "), returned
    assert "GPUs of quota taken back" in returned, returned
    assert f"still quarantined: {culprit}" in returned
    assert browser.eval("document.getElementById('error')") is None
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
