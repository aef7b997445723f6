"""``python -m trainops_devcluster.demo`` (``make demo``): the whole training lifecycle on the simulated cluster.

Starts a local S3 server and a 16-node devcluster (inference Deployments with PodDisruptionBudgets,
Kueue queues, a Virtual-Kubelet-like node as inference's overflow pool), a throw-away Airflow home, and
runs ``dags/training_lifecycle.py`` with dag.test(), while a steady load goes through the inference
Service (demo inference servers, real processes): the timeline shows its Ready replicas by pool and the
requests served and failed through the claim, the run and the gradual return.
Mid-run, once a checkpoint is verified, a GPU on one training node falls off the bus (XID 79): the
node is quarantined and the run resumes on the spare from the last verified step. The timeline
goes to the terminal, Airflow's own logs to a file. Exits 0 only when the end state is right.

``--trainer torch`` (``make demo-torch``) trains with the real PyTorch example
(``examples/torch_trainer/train.py``: two gloo ranks, sharded DCP checkpoints) and also checks that
the resumed state equals the saved one bit for bit and that the step count goes on from it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

DAG_ID = "training_lifecycle"
BUCKET = "trainops-demo"
WORKER = ("airflow", "airflow-worker")  # the ServiceAccount deploy/rbac.yaml binds for the workers
# per trainer: nodes, steps, checkpoint every, seconds per step, crash after step
DEFAULTS = {"simulated": (3, 400, 25, 0.1, 150), "torch": (2, 200, 25, 0.05, 75)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainops_devcluster.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--dags",
        type=Path,
        default=Path("dags"),
        help="the folder with training_lifecycle.py (default ./dags)",
    )
    parser.add_argument(
        "--trainer",
        choices=sorted(DEFAULTS),
        default="simulated",
        help="the demo's simulated trainer, or the real PyTorch example (torch)",
    )
    parser.add_argument(
        "--torch-trainer",
        type=Path,
        default=Path("examples/torch_trainer/train.py"),
        help="the PyTorch example trainer (default ./examples/torch_trainer/train.py)",
    )
    parser.add_argument(
        "--rbac",
        type=Path,
        default=Path("deploy/rbac.yaml"),
        help="the RBAC applied before the run; the DAG runs as the ServiceAccount it binds for the workers "
        "(default ./deploy/rbac.yaml)",
    )
    parser.add_argument("--nodes", type=int, help="training nodes (one spare is claimed too)")
    parser.add_argument("--steps", type=int, help="training steps")
    parser.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    parser.add_argument("--step-seconds", type=float, help="time per step (added to the real step for torch)")
    parser.add_argument("--crash-after-step", type=int, help="inject the XID after this checkpoint")
    args = parser.parse_args(argv)
    names = ("nodes", "steps", "checkpoint_every", "step_seconds", "crash_after_step")
    for name, default in zip(names, DEFAULTS[args.trainer], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not args.rbac.is_file():
        parser.error(f"--rbac {args.rbac}: no such file (run from the repository root)")
    if args.trainer == "torch" and not args.torch_trainer.is_file():
        parser.error(f"--torch-trainer {args.torch_trainer}: no such file (run from the repository root)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="trainops-demo-"))
    log_path = home / "airflow.log"

    from trainops_devcluster import airflow_home

    airflow_home.configure(
        home, {"dags-folder": args.dags.resolve()}
    )  # before Airflow is imported: it reads its configuration at import
    from trainops_devcluster.demo.timeline import Timeline, terminal_only_for_timeline

    print(f"trainops demo: Airflow home {home}; Airflow's own log: {log_path}", flush=True)
    started = time.monotonic()
    with terminal_only_for_timeline(log_path) as terminal:
        timeline = Timeline(terminal)
        ok = run(args, timeline)
        timeline.say(
            f"demo {'PASSED' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s (Airflow log: {log_path})"
        )
    return 0 if ok else 1


def run(args: argparse.Namespace, timeline) -> bool:
    from kubernetes import config

    from trainops_devcluster import airflow_home
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.demo.load import Load
    from trainops_devcluster.demo.scenario import (
        INFERENCE,
        LOAD_RPS,
        SERVICE,
        Cluster,
        Watcher,
        end_state_checks,
    )
    from trainops_devcluster.hardware import DEMO_FLEET
    from trainops_devcluster.local_s3 import local_s3

    run_name = "demo-run"
    run_uri = f"s3://{BUCKET}/runs/{run_name}/"
    with local_s3() as s3:
        s3.create_bucket(BUCKET)
        os.environ.update(s3.env())
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = s3.airflow_connection_uri()
        trainer_env = {
            **s3.env(),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        }
        timeline.say(f"local S3 at {s3.endpoint_url}, bucket {BUCKET}")
        with DevCluster(
            fleet=DEMO_FLEET,
            process_env=trainer_env,
            inference=INFERENCE,
            virtual_nodes=1,
        ) as dev:
            dev.wait_until_settled()
            dev.create_from_file(args.rbac)
            worker = dev.service_account_kubeconfig(*WORKER, dev.kubeconfig.with_name("worker-kubeconfig"))
            os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = airflow_home.kubernetes_connection(worker)
            os.environ["KUBECONFIG"] = str(worker)
            dev.inject("ecc", "gpu-node-015", uncorrectable=2)  # a node already broken before the run
            dev.probe_daemon.wait_rounds(1)
            cluster = Cluster(config.new_client_from_config(config_file=str(dev.kubeconfig)))
            seeded = {d["metadata"]["name"]: d["spec"]["replicas"] for d in cluster.list("deployments")}
            timeline.say(
                f"devcluster up at {dev.url}: {len(dev.fleet)} GPU nodes of mixed hardware ({DEMO_FLEET}) in {dev.fabric.describe()}; inference "
                + ", ".join(f"{name} {n} replicas" for name, n in seeded.items())
                + " (llm-chat: demo inference servers, overflow pool virtual-node-0)"
                + "; Kueue ClusterQueue 'training' with 0 GPUs; trainops runs as ServiceAccount "
                + "/".join(WORKER)
                + f" with {args.rbac}"
            )
            airflow_home.migrate()
            dag = airflow_home.load_dag(DAG_ID, args.dags.resolve())
            conf = {
                "run_name": run_name,
                "nodes": args.nodes,
                "spare_nodes": 1,
                "topology": "preferred",  # in one block if one holds the run, its spare beside it
                "command": trainer_command(args)
                + [
                    "--steps",
                    str(args.steps),
                    "--checkpoint-every",
                    str(args.checkpoint_every),
                    "--step-seconds",
                    str(args.step_seconds),
                ],
            }
            timeline.say(
                f"triggering {DAG_ID}: {args.nodes} nodes + 1 spare, topology preferred (one block), "
                f"{args.steps} steps, run {run_uri}, "
                f"{args.trainer} trainer"
            )
            service = dev.service_address(*SERVICE)
            timeline.say(f"load: {LOAD_RPS:g} requests/s to Service {SERVICE[0]}/{SERVICE[1]} ({service})")
            load = Load(service, LOAD_RPS).start("before")
            watcher = Watcher(timeline, cluster, dev, DAG_ID, run_uri, args.crash_after_step, load).start()
            try:
                dag_run = dag.test(run_conf=conf)
            finally:
                watcher.stop()
                load.stop()
            timeline.phases(load.report())
            timeline.say(f"DAG run finished: {dag_run.state}. Checking the cluster and the bucket:")
            user = "system:serviceaccount:{}:{}".format(*WORKER)
            calls = [e for e in dev.server.audit.entries() if e["user"] == user]
            ok = end_state_checks(
                timeline,
                cluster,
                dag_run,
                seeded,
                run_uri,
                watcher.crashed_node,
                calls,
                load,
                watcher.attempt_nodes,
            )
            if args.trainer == "torch":
                from trainops_devcluster.demo.torch_checks import torch_checks

                ok = (
                    torch_checks(
                        timeline,
                        run_uri,
                        args.torch_trainer.resolve(),
                        steps=args.steps,
                        every=args.checkpoint_every,
                        ranks=args.nodes,
                    )
                    and ok
                )
            return ok


def trainer_command(args: argparse.Namespace) -> list[str]:
    if args.trainer == "torch":
        return ["python", str(args.torch_trainer.resolve())]
    return ["python", "-m", "trainops_devcluster.demo.trainer"]


if __name__ == "__main__":
    sys.exit(main())
