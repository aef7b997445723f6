"""``trainops doctor``: is this cluster set up for trainops?  One line per check (ok, or the
problem and its fix), or ``--json``.  Exit code 0: all ok; 1: a problem found (or a check could not
finish); 2: the cluster cannot be read.

trainops doctor [--kubeconfig K] [--context C] [--prometheus URL] [--json] [--account worker] ...
"""

from __future__ import annotations

import argparse
import json
import sys

from trainops.doctor.config import CHECK_DEADLINE_S, DoctorConfig
from trainops.doctor.runner import ClusterUnreachable, run_doctor
from trainops.health.gate import DEFAULT_SELECTOR
from trainops.health.prometheus import DEFAULT_NODE_LABEL
from trainops.permissions import ACCOUNTS, WORKER

UNREADABLE = 2


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check that a cluster is set up for trainops (read-only)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--prometheus", metavar="URL", help="the Prometheus that scrapes dcgm-exporter (unset: not checked)"
    )
    parser.add_argument(
        "--prometheus-node-label",
        default=DEFAULT_NODE_LABEL,
        metavar="LABEL",
        help=f"the label naming the node in dcgm-exporter's series (default {DEFAULT_NODE_LABEL})",
    )
    parser.add_argument(
        "--selector", default=DEFAULT_SELECTOR, help=f"the GPU nodes (default {DEFAULT_SELECTOR})"
    )
    parser.add_argument(
        "--training-namespace", default="training", help="where runs train (default training)"
    )
    parser.add_argument(
        "--cluster-queue", default="training", help="the training ClusterQueue (default training)"
    )
    parser.add_argument(
        "--local-queue", default="training", help="the LocalQueue runs submit to (default training)"
    )
    parser.add_argument(
        "--priority-class",
        default="training-standard",
        help="the WorkloadPriorityClass runs name (default training-standard)",
    )
    parser.add_argument(
        "--probe-daemonset",
        default="kube-system/trainops-node-probe",
        metavar="NAMESPACE/NAME",
        help="the node probe's DaemonSet (default kube-system/trainops-node-probe)",
    )
    parser.add_argument(
        "--account",
        choices=ACCOUNTS,
        default=WORKER,
        help="whose permissions to ask for, as the caller (deploy/rbac.yaml's accounts; default worker)",
    )
    parser.add_argument(
        "--check-deadline",
        type=float,
        default=CHECK_DEADLINE_S,
        metavar="SECONDS",
        help=f"how long each check may take (default {CHECK_DEADLINE_S:g})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainops.health.prometheus import PrometheusClient
    from trainops.kube.client import Kube, KubeconfigError

    try:
        config = DoctorConfig(
            selector=args.selector,
            training_namespace=args.training_namespace,
            cluster_queue=args.cluster_queue,
            local_queue=args.local_queue,
            priority_class=args.priority_class,
            probe_daemon_set=args.probe_daemonset,
            prometheus=PrometheusClient(
                args.prometheus, node_label=args.prometheus_node_label, timeout=args.check_deadline
            )
            if args.prometheus
            else None,
            account=args.account,
            check_deadline_s=args.check_deadline,
        )
        kube = Kube.from_kubeconfig(args.kubeconfig, context=args.context)
        report = run_doctor(kube, config)
    except (ClusterUnreachable, KubeconfigError) as error:
        print(f"trainops doctor: {error}", file=sys.stderr)
        return UNREADABLE
    except ValueError as error:
        print(f"trainops doctor: error: {error}", file=sys.stderr)
        return UNREADABLE
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return report.exit_code
