"""Give back GPU nodes, quota and inference capacity still held by DAG runs that are gone.

The teardown of every lifecycle run returns what it claimed; this catches what a teardown cannot:
a worker killed (SIGKILL, the OOM killer) while claiming, or a teardown Airflow skipped because
its setup failed. Every 10 minutes it asks Airflow which holders' DAG runs are still queued or
running and returns the capacity of the others once their claim is older than ``grace_s``.
The same from a shell: ``trainops capacity reap --airflow-url http://localhost:8080``.
"""

from datetime import timedelta

from airflow.sdk import DAG, Param, task

with DAG(
    "trainops_reaper",
    schedule=timedelta(minutes=10),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    params={
        "cluster_queue": Param("training", type="string", description="The training ClusterQueue."),
        "training_namespace": Param(
            "training",
            type="string",
            description="Where the runs' training Jobs are: a gone run's Jobs are stopped before its nodes return.",
        ),
        "grace_s": Param(600, type="number", minimum=0, description="Seconds a claim is left alone."),
    },
    tags=["trainops"],
):

    @task(retries=2, retry_delay=timedelta(seconds=30))
    def reap_gone_runs(params=None, ti=None) -> dict:
        """Return what runs that are no longer queued or running hold (Airflow's own record says which)."""
        import dataclasses

        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        from trainops.capacity.reaper import ALIVE_STATES, reap
        from trainops.errors import TemporaryError

        def alive(run: str) -> bool | None:
            dag_id, _, run_id = run.partition("/")
            try:
                return ti.get_dr_count(dag_id=dag_id, run_ids=[run_id], states=list(ALIVE_STATES)) > 0
            except Exception:  # unknown: never reap on a guess
                return None

        kube = KubernetesClusterHook(conn_id="kubernetes_default").kube()
        summary = reap(
            kube,
            alive,
            cluster_queue=params["cluster_queue"],
            training_namespace=params["training_namespace"] or None,
            grace_s=float(params["grace_s"]),
        )
        if summary.failed:
            raise TemporaryError(f"returns failed: {summary.failed}")
        return dataclasses.asdict(summary)

    reap_gone_runs()
