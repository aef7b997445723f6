"""``trainops capacity``: see which nodes training runs hold, return one run's capacity by hand, and
reap what DAG runs that are gone still hold (``reap``, asking Airflow's REST API which runs are alive)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from trainops.capacity.claims import CLAIMED_AT_ANNOTATION, claim_age_s
from trainops.kube.nodes import NodeState, holder_of, is_quarantined


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("capacity", help="GPU nodes claimed from inference by training runs")
    commands = parser.add_subparsers(dest="capacity_command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig to use (default: $KUBECONFIG or ~/.kube/config)"
    )
    common.add_argument(
        "--cluster-queue", default="training", help="the training ClusterQueue (default training)"
    )
    returning = argparse.ArgumentParser(add_help=False)
    returning.add_argument(
        "--training-namespace",
        default="training",
        help="where the runs' training Jobs are; they are stopped before their nodes are returned "
        "(default training; '' to return without stopping them)",
    )
    returning.add_argument(
        "--wave-nodes",
        type=_positive_int,
        help="nodes per wave when replicas come back from an overflow pool (default: a quarter of the run's)",
    )

    status = commands.add_parser("status", parents=[common], help="list claimed nodes, their holders and age")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=run_status)

    give = commands.add_parser(
        "return", parents=[common, returning], help="return every node and loan of one run"
    )
    give.add_argument("--run", required=True, help="the run to return, as <dag_id>/<run_id>")
    give.add_argument("--ready-deadline", type=float, default=600, help="seconds for inference to be Ready")
    give.set_defaults(func=run_return)

    reap = commands.add_parser(
        "reap",
        parents=[common, returning],
        help="return the capacity of runs whose DAG run is no longer running",
    )
    reap.add_argument("--airflow-url", required=True, help="Airflow's API server, e.g. http://localhost:8080")
    reap.add_argument(
        "--token-env",
        default="AIRFLOW_API_TOKEN",
        help="environment variable holding a bearer token for the API (default AIRFLOW_API_TOKEN)",
    )
    reap.add_argument("--grace", type=float, default=600, help="seconds a claim is left alone (default 600)")
    reap.add_argument("--dry-run", action="store_true", help="only say what would be returned")
    reap.add_argument("--json", action="store_true", help="print the summary as JSON")
    reap.set_defaults(func=run_reap)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _kube(args: argparse.Namespace):
    from trainops.kube.client import Kube

    return Kube.from_kubeconfig(str(args.kubeconfig) if args.kubeconfig else None)


def claimed_nodes(nodes: list[dict], now: datetime) -> list[dict]:
    """One row per claimed node: node, holder, claimed_at, age_s, quarantined."""
    rows = []
    for node in nodes:
        state = NodeState.of(node)
        holder = holder_of(state.annotations)
        if not holder:
            continue
        age = claim_age_s(state.annotations, now)
        rows.append(
            {
                "node": state.name,
                "holder": holder,
                "claimed_at": state.annotations.get(CLAIMED_AT_ANNOTATION),
                "age_s": None if age is None else int(age),
                "quarantined": is_quarantined(state),
            }
        )
    return rows


def inference_loans(lenders: dict[str, list]) -> dict[str, list[dict]]:
    """Per run, what each inference object lends it: the fields it changed (``path``, ``prior``,
    ``set``), and the primary Deployment when the object is an overflow companion."""
    from trainops.capacity.loans import loans_of
    from trainops.capacity.overflow import primary_of

    out: dict[str, list[dict]] = {}
    for run, objects in sorted(lenders.items()):
        for ref, obj in objects:
            primary = primary_of(ref, obj)
            fields = [
                {"path": ".".join(e["path"]), "prior": e["prior"], "set": e["set"]}
                for e in loans_of(obj)[run]
            ]
            out.setdefault(run, []).append(
                {"workload": str(ref), "fields": fields, "overflow_of": str(primary) if primary else None}
            )
    return out


def run_status(args: argparse.Namespace) -> int:
    from trainops.capacity.inference import loans_by_run
    from trainops.capacity.quota import grants_of
    from trainops.kube.nodes import list_nodes

    kube = _kube(args)
    rows = claimed_nodes(list_nodes(kube.core), datetime.now(UTC))
    queue = kube.get(kube.kueue("clusterqueues", namespaced=False), args.cluster_queue)
    grants = grants_of(queue) if queue else {}
    loans = inference_loans(loans_by_run(kube.custom, kube.deadline()))
    if args.json:
        print(json.dumps({"nodes": rows, "quota_grants": grants, "inference_loans": loans}, indent=2))
        return 0
    if not rows:
        print("no claimed nodes")
    else:
        print(f"{'NODE':<20} {'HOLDER':<50} {'AGE':>8}  QUARANTINED")
        for row in rows:
            age = "?" if row["age_s"] is None else _age(row["age_s"])
            print(f"{row['node']:<20} {row['holder']:<50} {age:>8}  {'yes' if row['quarantined'] else 'no'}")
    for run, grant in sorted(grants.items()):
        print(
            f"ClusterQueue {args.cluster_queue}: {run} holds {grant['gpus']} GPUs of flavor {grant['flavor']}"
        )
    for run, lent in loans.items():
        for loan in lent:
            changed = (
                ", ".join(f"{f['path']} {f['prior']} -> {f['set']}" for f in loan["fields"])
                or "nothing scaled"
            )
            where = f" (overflow pool of {loan['overflow_of']})" if loan["overflow_of"] else ""
            print(f"inference: {run} borrows from {loan['workload']}{where}: {changed}")
    return 0


def _age(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def run_return(args: argparse.Namespace) -> int:
    import logging

    from kubernetes.client.exceptions import ApiException

    from trainops.capacity.procedure import Deadlines, give_back
    from trainops.errors import TrainopsError

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        summary = give_back(
            _kube(args),
            args.run,
            cluster_queue=args.cluster_queue,
            training_namespace=args.training_namespace or None,
            wave_nodes=args.wave_nodes,
            deadlines=Deadlines(ready_s=args.ready_deadline),
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (TrainopsError, ApiException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


def run_reap(args: argparse.Namespace) -> int:
    import dataclasses
    import logging
    import os

    from trainops.capacity.reaper import AirflowRuns, reap
    from trainops.errors import TrainopsError

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        runs = AirflowRuns(args.airflow_url, os.environ.get(args.token_env) or None)
        summary = reap(
            _kube(args),
            runs.alive,
            cluster_queue=args.cluster_queue,
            training_namespace=args.training_namespace or None,
            wave_nodes=args.wave_nodes,
            grace_s=args.grace,
            dry_run=args.dry_run,
        )
    except (ValueError, TrainopsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(dataclasses.asdict(summary), indent=2))
    else:
        for run in summary.returned:
            print(f"returned {run}")
        for run, why in summary.kept.items():
            print(f"kept {run}: {why}")
        for run, why in summary.failed.items():
            print(f"FAILED {run}: {why}")
    return 1 if summary.failed else 0
