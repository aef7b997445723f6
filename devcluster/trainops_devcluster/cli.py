"""``trainops devcluster``: run the simulated GPU cluster, and inject faults into a running one."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from trainops_devcluster.kinds import KUEUE_VERSIONS
from trainops_devcluster.prometheus import REAL_SCRAPE_INTERVAL_S

FAULT_OPTIONS = {
    "--exit-code": int,
    "--reason": str,
    "--code": int,
    "--gpu": int,
    "--uncorrectable": int,
    "--port": int,
    "--replay": int,
    "--factor": float,
    "--path": str,
    "--status": int,
    "--count": int,
    "--fraction": float,
    "--link": int,
    "--width": int,
    "--degrees": float,
    "--device": str,
    "--rate": str,
    "--counter": str,
    "--error": str,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("devcluster", help="the simulated GPU Kubernetes cluster (devcluster)")
    commands = parser.add_subparsers(dest="devcluster_command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run a devcluster in the foreground until interrupted")
    up.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    up.add_argument("--nodes", type=int, default=16, help="GPU nodes (default 16)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    up.add_argument(
        "--fleet",
        metavar="SPEC",
        help="the GPU nodes' hardware instead of --nodes HGX H100 nodes, e.g. "
        "'4*h100-sxm/ib-ndr, 2*l40s/roce-200, t4:pool=none/none' or 'demo' (a mixed fleet); "
        "see trainops_devcluster.hardware",
    )
    up.add_argument(
        "--exporter-node-label",
        default="Hostname",
        help="label naming the node in the simulated dcgm-exporter's series (Hostname: 4.x releases; hostname: main)",
    )
    up.add_argument(
        "--fabric",
        help="the GPU nodes' blocks and racks: blocks separated by '/', rack sizes by ',', e.g. '4,4/4,4' "
        "(default: racks of 4 nodes, 2 racks per block)",
    )
    up.add_argument(
        "--system-nodes", type=int, default=2, help="untainted CPU nodes for system pods (default 2)"
    )
    up.add_argument(
        "--virtual-nodes",
        type=int,
        default=0,
        help="Virtual-Kubelet-like nodes, an overflow pool for inference: type=virtual-kubelet, tainted "
        "virtual-kubelet.io/provider (default 0)",
    )
    up.add_argument(
        "--kubeconfig", type=Path, default=Path("devcluster.kubeconfig"), help="kubeconfig to write"
    )
    up.add_argument("--seed", type=int, default=0, help="seed for the simulated telemetry")
    up.add_argument(
        "--no-probe-gemm",
        action="store_true",
        help="run the node probe as deploy/node-probe.yaml does, without --gemm (no measured speeds)",
    )
    up.add_argument(
        "--log-file", type=Path, help="the devcluster's log (default: devcluster.log beside the kubeconfig)"
    )
    up.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus (Debian's prometheus binary)"
    )
    up.add_argument(
        "--prometheus-port", type=int, default=0, help="Prometheus port; 0 picks a free one (default)"
    )
    up.add_argument(
        "--scrape-interval",
        type=float,
        default=REAL_SCRAPE_INTERVAL_S,
        help=f"Prometheus scrape interval in seconds (default {REAL_SCRAPE_INTERVAL_S:g})",
    )
    up.add_argument(
        "--kueue-version",
        choices=KUEUE_VERSIONS,
        help="the Kueue API version served: v1beta2 (Kueue >= 0.15) or v1beta1 with Kueue 0.13's reasons "
        "(default: $TRAINOPS_DEVCLUSTER_KUEUE_VERSION, else v1beta2)",
    )
    up.add_argument(
        "--apply",
        type=Path,
        action="append",
        default=[],
        metavar="MANIFEST",
        help="create the objects of this YAML manifest at start, as the admin (e.g. deploy/rbac.yaml); repeatable",
    )
    up.add_argument(
        "--service-account",
        type=_service_account,
        action="append",
        default=[],
        metavar="NS/NAME=KUBECONFIG",
        help="write a kubeconfig with a token of ServiceAccount NS/NAME (created if absent), after "
        "--apply; what a pod running as it has; repeatable",
    )
    up.set_defaults(func=run_up)

    inject = commands.add_parser(
        "inject",
        help="inject a fault into a running devcluster",
        description="Faults: crash-pod NS/POD, crash-job NS/JOB, hang NS/JOB, xid NODE --code N, "
        "ecc NODE --uncorrectable N, ib-down NODE [--device D --port P], nvlink-errors NODE --replay N, "
        "slow-gpu NODE --factor F, nvlink-down NODE --gpu G --link L, pcie-degraded NODE --width W, "
        "overheat NODE --degrees D, remap-failure NODE, retire-pages NODE --count N, mig-device-lost NODE, "
        "ib-rate NODE --rate '200 Gb/sec (4X HDR)', ib-errors NODE --counter symbol_error --count N, "
        "nvml-init-error NODE --error NVML_ERROR_LIBRARY_NOT_FOUND, "
        "telemetry-missing NODE, repair NODE, node-notready NODE, api-fault --path REGEX --status S (--count N | --fraction F), "
        "drop-watches.",
    )
    inject.add_argument("--kubeconfig", type=Path, required=True, help="the devcluster's kubeconfig")
    inject.add_argument("fault", help="fault name, e.g. xid")
    inject.add_argument("target", nargs="?", default="", help="NODE or NAMESPACE/NAME, as the fault needs")
    for flag, kind in FAULT_OPTIONS.items():
        inject.add_argument(flag, type=kind)
    inject.set_defaults(func=run_inject)


def _service_account(text: str) -> tuple[str, str, Path]:
    """``NS/NAME=KUBECONFIG`` -> (namespace, name, path)."""
    account, _, path = text.partition("=")
    namespace, _, name = account.partition("/")
    if not (namespace and name and path):
        raise argparse.ArgumentTypeError(f"expected NS/NAME=KUBECONFIG, got {text!r}")
    return namespace, name, Path(path)


TOKEN_EXPIRATION_S = 365 * 24 * 3600  # a playground's life; a kubelet refreshes a pod's token instead


def run_up(args: argparse.Namespace) -> int:
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.hardware import DEMO_FLEET
    from trainops_devcluster.kueue import KueueConfig
    from trainops_devcluster.prometheus import PrometheusUnavailable

    log_file = (args.log_file or args.kubeconfig.resolve().with_name("devcluster.log")).resolve()
    try:
        cluster = DevCluster(
            args.nodes,
            args.gpus_per_node,
            fleet=DEMO_FLEET if args.fleet == "demo" else args.fleet,
            exporter_node_label=args.exporter_node_label,
            host=args.host,
            port=args.port,
            kubeconfig=args.kubeconfig.resolve(),
            seed=args.seed,
            probe_gemm=not args.no_probe_gemm,
            system_nodes=args.system_nodes,
            virtual_nodes=args.virtual_nodes,
            prometheus=not args.no_prometheus,
            scrape_interval_s=args.scrape_interval,
            prometheus_port=args.prometheus_port,
            prometheus_log=log_file.with_name("prometheus.log"),
            kueue_config=KueueConfig(version=args.kueue_version) if args.kueue_version else None,
            fabric=args.fabric,
        )
    except ValueError as error:
        print(f"trainops devcluster up: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        filename=log_file, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        cluster.start()
    except PrometheusUnavailable as error:
        print(f"trainops devcluster up: {error}", file=sys.stderr)
        return 1
    try:
        print(f"devcluster API listening on {cluster.url}", flush=True)
        print(f"kubeconfig written to {cluster.kubeconfig}", flush=True)
        print(f"devcluster log: {log_file}", flush=True)
        if cluster.prometheus_url:
            print(f"prometheus: {cluster.prometheus_url}", flush=True)
            print(f"prometheus log: {cluster.prometheus.log_file}", flush=True)
        ca = cluster.kubeconfig.with_name("devcluster-ca.crt")
        ca.write_bytes(cluster.server.serving_cert.cert_pem)
        print(f"HTTPS for ServiceAccount tokens: {cluster.server.secure_url} (certificate: {ca})", flush=True)
        for manifest in args.apply:
            try:
                cluster.create_from_file(manifest)
            except (OSError, ValueError) as error:  # unreadable, not YAML, or refused by the API
                print(f"trainops devcluster up: --apply {error}", file=sys.stderr)
                return 1
            print(f"applied {manifest}", flush=True)
        for namespace, name, path in args.service_account:
            written = path.resolve().with_name(path.name + ".partial")  # readers see it whole or not at all
            cluster.service_account_kubeconfig(namespace, name, written, expiration_s=TOKEN_EXPIRATION_S)
            written.replace(path)
            print(f"kubeconfig of ServiceAccount {namespace}/{name} written to {path}", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


def run_inject(args: argparse.Namespace) -> int:
    import requests
    import yaml

    try:
        config = yaml.safe_load(args.kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError) as error:
        print(
            f"trainops devcluster inject: cannot read the server from --kubeconfig {args.kubeconfig}: {error}"
        )
        return 2
    options = {
        flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
        for flag in FAULT_OPTIONS
    }
    body = {"target": args.target, **{k: v for k, v in options.items() if v is not None}}
    response = requests.post(f"{server}/devcluster/faults/{args.fault}", json=body, timeout=30)
    payload = response.json()
    if response.status_code != 200:
        print(f"trainops devcluster inject: {payload.get('error', payload)}", file=sys.stderr)
        return 1
    print(json.dumps(payload))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``trainops-devcluster up|inject ...``: the same as ``trainops devcluster ...``."""
    parser = argparse.ArgumentParser(prog="trainops-devcluster")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["devcluster", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args) or 0
