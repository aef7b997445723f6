"""The lifecycle's ``preflight`` task: ``trainops doctor`` as the workers' account, before anything is
reserved or claimed.  The e2e cluster runs the devcluster's stand-in probe, not deploy/node-probe.yaml,
and has no probe admission policy: set up wrong, so a run with preflight on fails there, naming both."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import DAG_ID, lifecycle_conf, task_instances, writes

DEPLOY = Path(__file__).parents[2] / "deploy"


def test_preflight_on_fails_the_run_naming_each_problem_and_its_fix_before_any_write(
    cluster, bucket, run_dag, capfd
):
    cluster.create_from_file(DEPLOY / "doctor-rbac.yaml")
    cluster.server.audit.clear()

    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "preflight", preflight=True))

    assert dag_run.state == "failed"
    states = {task_id: ti.state for task_id, ti in task_instances(dag_run).items()}
    assert states["preflight"] == "failed" and states["reserve_run_path"] == "upstream_failed", states
    log = capfd.readouterr().out
    assert "DaemonSet kube-system/trainops-node-probe does not exist" in log
    assert "kubectl apply -f deploy/node-probe.yaml" in log
    assert "ValidatingAdmissionPolicy trainops-node-probe-own-node does not exist" in log
    assert "ok       permissions" in log  # the worker's own grants, asked as the worker
    entries = cluster.server.audit.entries()
    assert [e for e in entries if e["status"] in (401, 403)] == []  # doctor-rbac.yaml grants every read
    assert [e["path"] for e in writes(cluster) if "selfsubjectaccessreviews" not in e["path"]] == []
