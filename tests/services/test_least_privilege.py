"""Least privilege, proven on the real Airflow services: each service ran as its own ServiceAccount
(``stack_spec.SERVICE_ACCOUNTS``) with ``deploy/rbac.yaml`` applied, and the devcluster's audit log
of the whole suite says what each one called.

The conftest runs this module after every other test of tests/services, so the log covers the
lifecycle runs, the health gate waiting deferred, the XID resume, the Clear, the runs failed by hand
(with and without the triggerer) and the UI's fleet, release and return.  It fails on any call of an Airflow service that was refused
(401/403), on any call of the scheduler or the dag-processor (they run no trainops code that needs the
cluster), and on a grant of the triggerer or the API server that neither the suite nor the code
uses.  The calls each account made are printed (``pytest -rP``)."""

from __future__ import annotations

import inspect
from collections import Counter

import pytest
import requests
from trainops_devcluster.audit import AuditLog
from trainops_devcluster.stack_spec import AIRFLOW_NAMESPACE, SERVICE_ACCOUNTS

from tests.e2e.test_rbac_least_privilege import (
    ONLY_WHEN_A_REPORT_LAGS,
    ONLY_WITH_INTEGRATIONS,
    attributes_of,
    grants,
)

PREFIX = f"system:serviceaccount:{AIRFLOW_NAMESPACE}:"
ACCOUNTS = {service: PREFIX + account for service, account in SERVICE_ACCOUNTS.items()}
# Grants the code calls on paths this suite does not take (each named with its caller):
NOT_EXERCISED_HERE = {
    "airflow-triggerer": {
        # HealthGateTrigger over named nodes (fabric_ready deferred, waiting for a port to come
        # back) GETs each node's report; here the fabric check passes at once.  (The deferred
        # health_gate over the pool lists them: exercised.  GangRunTrigger reads nodes and deactivates
        # the crashed attempt's Workload when it judges the XID: exercised.)
        ("", "configmaps", "get"),
    },
    "airflow-apiserver": {
        # "Return this run's GPUs" on a run still training: the stop records the attempt's end on its Job
        # (trainops.io/end), reads the Job and deactivates its Workload.  The suite returns a run that
        # has finished.
        ("batch", "jobs", "get"),
        ("batch", "jobs", "patch"),
        ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "workloads", "patch"),
        # "Return this run's GPUs" on a run whose inference served from an overflow pool deletes the
        # emptied companion Deployment; the suite's runs have no overflow pool.
        ("apps", "deployments", "delete"),
    },
}


@pytest.fixture(scope="module")
def audit(services) -> list[dict]:
    entries = requests.get(f"{services.at.devcluster_url}/devcluster/audit", timeout=30).json()["entries"]
    limit = inspect.signature(AuditLog).parameters["limit"].default
    assert len(entries) < limit, "the audit log is full: its oldest calls are lost"
    return entries


def calls(entries: list[dict]) -> Counter:
    """(verb, group/resource[/subresource], namespace) of each API request, counted."""
    found = Counter()
    for entry in entries:
        a = attributes_of(entry)
        what = f"{a.group}/{a.resource_path}" if a.resource_request else entry["path"].split("?")[0]
        found[(a.verb, what.lstrip("/"), a.namespace or "")] += 1
    return found


def test_report_each_accounts_calls(audit):
    for service, user in ACCOUNTS.items():
        made = calls([e for e in audit if e["user"] == user])
        print(f"\n{user} ({service}): {sum(made.values())} calls")
        for (verb, what, namespace), count in sorted(made.items()):
            print(f"  {verb:6} {what:45} {namespace or '(cluster)':16} x{count}")


def test_no_call_of_an_airflow_service_was_refused(audit):
    """Only the Airflow services hold tokens that are not the admin's: a 401 (user unknown) is one of theirs."""
    refused = sorted(
        {
            (e["status"], e["user"] or "(no user)", e["method"], e["path"], e["user_agent"])
            for e in audit
            if e["status"] == 401 or (e["status"] == 403 and e["user"].startswith(PREFIX))
        }
    )
    assert refused == [], f"calls of the Airflow services the API server refused: {refused}"


def test_the_services_that_run_trainops_called_as_themselves_and_the_others_not_at_all(audit):
    users = Counter(e["user"] for e in audit if e["user"].startswith(PREFIX))
    for service in ("airflow-worker", "airflow-triggerer", "airflow-apiserver"):
        assert users[ACCOUNTS[service]], f"{service} made no call as {ACCOUNTS[service]}"
    for service in ("airflow-scheduler", "airflow-dag-processor"):
        made = calls([e for e in audit if e["user"] == ACCOUNTS[service]])
        assert not made, f"{service} has no grants and should call nothing, but called {dict(made)}"


@pytest.mark.parametrize("service", ["airflow-triggerer", "airflow-apiserver"])
def test_every_grant_of_the_triggerer_and_the_api_server_is_used(audit, service):
    account = (AIRFLOW_NAMESPACE, SERVICE_ACCOUNTS[service])
    requests_made = [attributes_of(e) for e in audit if e["user"] == ACCOUNTS[service]]
    used = {(a.group, a.resource_path, a.verb) for a in requests_made if a.resource_request}
    granted = {(g, r, v) for _, g, r, v in grants(account)}
    unused = sorted(
        granted - used - ONLY_WITH_INTEGRATIONS - ONLY_WHEN_A_REPORT_LAGS - NOT_EXERCISED_HERE[service]
    )
    assert unused == [], f"grants of {service} never used: {unused}"
