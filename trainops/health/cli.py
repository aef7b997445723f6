"""``trainops probe``: the node probe (runs on every GPU node, e.g. as a DaemonSet), and
``trainops health``: the gate and the release of quarantined nodes, for operators.

trainops probe --once [--json] [--window S] [--gemm]
trainops probe --publish --node NAME [--interval S] [--fabric-watch S] [--kubeconfig K] [--hold-nvml]
trainops health gate [--kubeconfig K] [--selector S] [--prometheus URL] [--min-nodes N] [--dry-run] [--json]
trainops health release NODE [--kubeconfig K] [--prometheus URL]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from trainops.health.gate import DEFAULT_SELECTOR, GateConfig, GateError, run_gate
from trainops.health.gemm import measure_gemm_tflops, once_per_boot
from trainops.health.ib_reader import SysfsIbReader
from trainops.health.nvml_reader import NvmlReader, load_pynvml
from trainops.health.policy import Policy, evaluate, load_policy
from trainops.health.probe import (
    FABRIC_WATCH_S,
    FAULT_WINDOW_S,
    NODE_HEARTBEAT_S,
    PUBLISH_INTERVAL_S,
    REPORT_HEARTBEAT_S,
    Publisher,
    collect_report,
    link_states,
    publish,
    wait_for_next_sample,
)
from trainops.health.prometheus import DEFAULT_NODE_LABEL, PrometheusClient
from trainops.health.quarantine import ReleaseRefused, apply_quarantine, release
from trainops.health.report import HealthReport
from trainops.health.stragglers import UNKNOWN_SPEED
from trainops.kube.client import api_message
from trainops.kube.retry import Deadline

WRITE_DEADLINE_S = 60.0


def register(subparsers: Any) -> None:
    _register_probe(subparsers)
    _register_health(subparsers)


def _register_probe(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "probe", help="read this node's GPU and fabric health", description=__doc__
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="collect one report and print it")
    mode.add_argument(
        "--publish", action="store_true", help="publish reports (ConfigMap + node summary), repeatedly"
    )
    parser.add_argument("--json", action="store_true", help="--once: print the report as JSON")
    parser.add_argument(
        "--window", type=float, default=0.0, help="--once: seconds between two samples (rates)"
    )
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"), help="node name (default: $NODE_NAME)")
    parser.add_argument(
        "--interval", type=float, default=PUBLISH_INTERVAL_S, help="--publish: seconds between reports"
    )
    parser.add_argument(
        "--fabric-watch",
        type=float,
        default=FABRIC_WATCH_S,
        help="--publish: re-read the fabric ports' link state this often between reports, and report at "
        "once when a link went down or came back (0: only every --interval)",
    )
    parser.add_argument(
        "--iterations", type=int, default=0, help="--publish: stop after N reports (0: never)"
    )
    parser.add_argument(
        "--report-heartbeat",
        type=float,
        default=REPORT_HEARTBEAT_S,
        help="--publish: rewrite an unchanged report this often, seconds (keep under the policy's report_age)",
    )
    parser.add_argument(
        "--node-heartbeat",
        type=float,
        default=NODE_HEARTBEAT_S,
        help="--publish: rewrite an unchanged GPUHealthy condition this often, seconds",
    )
    parser.add_argument("--kubeconfig", help="--publish: kubeconfig file (default: in-cluster, then ~/.kube)")
    parser.add_argument(
        "--ib-sysfs",
        default="/sys/class/infiniband",
        help="RDMA sysfs root (deploy/node-probe.yaml mounts the host's /sys at /host/sys)",
    )
    parser.add_argument(
        "--fault-window",
        type=float,
        default=FAULT_WINDOW_S,
        help=f"seconds a burst fault (XIDs, error counters, clocks held down) keeps showing after it was "
        f"last seen (default {FAULT_WINDOW_S:g})",
    )
    parser.add_argument(
        "--gemm",
        action="store_true",
        help="also time a short GEMM per GPU, once per probe start and only on idle GPUs (needs torch+CUDA; "
        "its CUDA context then holds the driver for the probe's life)",
    )
    parser.add_argument(
        "--hold-nvml",
        action="store_true",
        help="--publish: keep NVML open between reports, watching XIDs continuously (default: NVML is open "
        "only while a report is sampled, so a driver upgrade can unload the driver between samples; XIDs "
        "raised between samples then come from dcgm-exporter)",
    )
    parser.set_defaults(func=run_probe)


def run_probe(args: argparse.Namespace) -> int:
    if args.publish and not args.node:
        print("error: --publish needs --node NAME (or $NODE_NAME)", file=sys.stderr)
        return 2
    if args.window < 0 or args.interval <= 0 or args.iterations < 0 or args.fabric_watch < 0:
        print(
            "error: --window must be >= 0, --interval > 0, --fabric-watch >= 0 and --iterations >= 0",
            file=sys.stderr,
        )
        return 2
    if args.fault_window <= 0:
        print("error: --fault-window must be > 0 seconds", file=sys.stderr)
        return 2
    if not 0 < args.report_heartbeat <= args.node_heartbeat:
        print("error: --report-heartbeat must be > 0 and <= --node-heartbeat", file=sys.stderr)
        return 2
    ib_reader = SysfsIbReader(args.ib_sysfs)
    speed_probe = once_per_boot(measure_gemm_tflops) if args.gemm else None
    window = args.fault_window
    nvml = NvmlReader(load_pynvml(), xid_lookback_s=window)
    if args.once:
        with nvml:
            node = args.node or socket.gethostname()
            previous = None
            if args.window:
                previous = collect_report(nvml, ib_reader, node, window_s=window)
                time.sleep(args.window)
            report = collect_report(
                nvml, ib_reader, node, speed_probe=speed_probe, previous=previous, window_s=window
            )
            return _print_once(report, args.json)
    with _stop_on_sigterm() as stop:
        if args.hold_nvml:
            with nvml:  # closed (event set freed, nvmlShutdown) however the loop ends
                return _publish_loop(args, nvml, ib_reader, speed_probe, stop)
        return _publish_loop(args, nvml, ib_reader, speed_probe, stop)


@contextmanager
def _stop_on_sigterm() -> Iterator[threading.Event]:
    """An event SIGTERM sets, for the loop to end between reports instead of at the kubelet's SIGKILL.

    The probe runs as its container's PID 1 (deploy/probe.Dockerfile), and the kernel delivers no
    signal to PID 1 that has no handler: without one, a pod the DaemonSet controller deletes (the
    node's ``nvidia.com/gpu.deploy.client`` label paused for a driver upgrade) would hold the driver
    until its grace period ran out."""
    stop = threading.Event()
    try:
        before = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    except ValueError:  # not the main thread (embedded): the caller handles signals
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, before)


def _print_once(report: HealthReport, as_json: bool) -> int:
    verdict = evaluate(report)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"{report.node}: {verdict.verdict} (default policy)")
        for reason in verdict.reasons:
            print(f"  {reason}")
        for line in verdict.not_applicable:
            print(f"  not applicable: {line}")
    gpu_count = report.signals["gpu_count"]
    if not gpu_count.known:
        print(f"error: GPU health unknown: {gpu_count.reason}", file=sys.stderr)
        return 1
    return 0


def _publish_loop(
    args: argparse.Namespace,
    nvml: NvmlReader,
    ib_reader: SysfsIbReader,
    speed_probe,
    stop: threading.Event,
) -> int:
    """Report, publish, wait ``--interval`` (less when a fabric link changes meanwhile:
    ``--fabric-watch``); until ``--iterations`` or SIGTERM (``stop``). Unless NVML
    is held (``--hold-nvml``), each report opens NVML for its sample only: it is shut down before the
    report is published and while the loop waits."""
    core_api = _core_api(args.kubeconfig)
    publisher = Publisher(report_heartbeat_s=args.report_heartbeat, node_heartbeat_s=args.node_heartbeat)
    previous: HealthReport | None = None
    published = 0
    failed = False
    while not stop.is_set():
        report = collect_report(
            nvml, ib_reader, args.node, speed_probe=speed_probe, previous=previous, window_s=args.fault_window
        )
        try:
            writes = publish(report, core_api, publisher)
            wrote = [what for what in ("configmap", "condition") if getattr(writes, what) is not None]
            print(
                f"{args.node}: {writes.verdict.verdict}; wrote {', '.join(wrote) or 'nothing (unchanged)'}",
                flush=True,
            )
            failed = False
        except Exception as err:  # keep probing through API outages; the next round retries
            print(
                f"error: publishing to node {args.node} failed: {api_message(err)}",
                file=sys.stderr,
                flush=True,
            )
            failed = True
        previous = report
        published += 1
        if args.iterations and published >= args.iterations:
            return 1 if failed else 0
        if wait_for_next_sample(
            stop, args.interval, args.fabric_watch, ib_reader, link_states(report.ib_ports)
        ):
            print(f"{args.node}: a fabric link changed: reporting now", flush=True)
    print(f"{args.node}: SIGTERM: stopped, NVML shut down", flush=True)
    return 1 if failed else 0


def _core_api(kubeconfig: str | None) -> Any:
    from trainops.kube.client import Kube

    return Kube.from_kubeconfig(kubeconfig).core


def _register_health(subparsers: Any) -> None:
    parser = subparsers.add_parser("health", help="gate GPU nodes for a run; release quarantined nodes")
    commands = parser.add_subparsers(dest="health_command", required=True, metavar="COMMAND")

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
        sub.add_argument("--prometheus", metavar="URL", help="Prometheus base URL with dcgm-exporter metrics")
        sub.add_argument(
            "--prometheus-node-label",
            default=DEFAULT_NODE_LABEL,
            metavar="LABEL",
            help=f"the label naming the node in dcgm-exporter's series (default {DEFAULT_NODE_LABEL})",
        )
        sub.add_argument(
            "--prometheus-optional",
            action="store_true",
            help="if Prometheus is unreachable, use the node probe's reports alone (default: fail)",
        )
        sub.add_argument("--policy", metavar="FILE", help="policy row overrides (JSON or YAML mapping)")
        sub.add_argument(
            "--fabrics",
            metavar="FILE|JSON",
            help='the cluster\'s RDMA fabrics, e.g. \'{"default": {"rate_gbps": 400}, "roce": {"link_layer": '
            '"Ethernet", "hcas": "mlx5_0,mlx5_1"}}\' or a JSON/YAML file of that mapping',
        )
        sub.add_argument(
            "--fabric-label",
            metavar="LABEL",
            help="node label naming a node's fabric (default trainops.io/fabric)",
        )
        sub.add_argument(
            "--fault-window",
            type=float,
            metavar="S",
            help="seconds an XID from Prometheus or a slowdown seen in training keeps a node out (default 7200)",
        )

    gate = commands.add_parser(
        "gate", help="evaluate candidate nodes, quarantine failing ones, choose a tier"
    )
    common(gate)
    gate.add_argument(
        "--selector", default=DEFAULT_SELECTOR, help=f"candidate node labels (default {DEFAULT_SELECTOR})"
    )
    gate.add_argument("--min-nodes", type=int, default=1, help="healthy nodes the run needs (default 1)")
    gate.add_argument("--no-speed-tiers", action="store_true", help="do not group nodes by measured speed")
    gate.add_argument(
        "--unknown-speed",
        choices=UNKNOWN_SPEED,
        default="group",
        help="nodes without a measured speed: a group of their own (default) or left out",
    )
    gate.add_argument("--dry-run", action="store_true", help="quarantine nothing; only report")
    gate.add_argument("--json", action="store_true", help='print {"nodes": [...], "selected": [...]} as JSON')
    gate.set_defaults(func=run_health_gate)

    rel = commands.add_parser("release", help="re-check a quarantined node and release it if it passes")
    common(rel)
    rel.add_argument("node", metavar="NODE")
    rel.set_defaults(func=run_health_release)


def _policy(args: argparse.Namespace) -> Policy:
    """The policy with ``--policy`` overrides and the cluster's ``--fabrics``/``--fabric-label``/``--fault-window``."""
    fabrics = None
    if args.fabrics:
        text = args.fabrics if args.fabrics.lstrip().startswith("{") else Path(args.fabrics).read_text()
        try:
            fabrics = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"--fabrics: not a JSON or YAML mapping: {err}") from None
    return load_policy(args.policy).with_settings(fabrics, args.fabric_label, args.fault_window)


def _on_unavailable(args: argparse.Namespace) -> str:
    return "probe-only" if args.prometheus_optional else "fail"


def _prometheus(args: argparse.Namespace) -> PrometheusClient | None:
    return (
        PrometheusClient(args.prometheus, node_label=args.prometheus_node_label) if args.prometheus else None
    )


def run_health_gate(args: argparse.Namespace) -> int:
    try:
        config = GateConfig(
            selector=args.selector,
            min_nodes=args.min_nodes,
            policy=_policy(args),
            speed_tiers=not args.no_speed_tiers,
            unknown_speed=args.unknown_speed,
            on_unavailable=_on_unavailable(args),
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    core_api = _core_api(args.kubeconfig)
    try:
        result = run_gate(core_api, config, prometheus=_prometheus(args))
    except GateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    written = [] if args.dry_run else apply_quarantine(core_api, result, Deadline(WRITE_DEADLINE_S))
    if args.json:
        print(json.dumps({**result.to_dict(), "quarantined_now": written}, indent=2))
    else:
        print(result.table())
        if written:
            print(f"quarantined now: {', '.join(written)}")
        elif args.dry_run and result.to_quarantine:
            print(f"dry run: would quarantine {', '.join(n.name for n in result.to_quarantine)}")
    return 0 if result.enough else 1


def run_health_release(args: argparse.Namespace) -> int:
    try:
        policy = _policy(args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        outcome = release(
            _core_api(args.kubeconfig),
            args.node,
            Deadline(WRITE_DEADLINE_S),
            policy=policy,
            prometheus=_prometheus(args),
            on_unavailable=_on_unavailable(args),
        )
    except (ReleaseRefused, GateError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if outcome.released:
        print(f"{args.node}: released ({outcome.verdict})")
    else:
        print(f"{args.node}: not quarantined; nothing to release")
    return 0
