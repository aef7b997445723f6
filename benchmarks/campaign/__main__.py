"""``python -m benchmarks.campaign --runs 200 --seed 1 --json benchmarks/campaign.json --readme README.md``:
the table, the JSON (stamped with the commit, the measured code and the options), the README's section."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.campaign.readme import table, written
from benchmarks.campaign.stamp import stamp

BENCH_DAGS = Path(__file__).resolve().parents[1] / "dags"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.campaign", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=16, help="GPU nodes of 8 GPUs in the devcluster")
    parser.add_argument("--scale", type=float, default=60.0, help="production seconds per campaign second")
    parser.add_argument("--no-baseline", action="store_true", help="run trainops only")
    parser.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: all)")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    parser.add_argument(
        "--readme", type=Path, help="write the campaign section of this README from the result"
    )
    parser.add_argument("--log", type=Path, help="the procedures' log (INFO) goes here; else errors only")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.nodes < 4:
        parser.error("--runs must be >= 1 and --nodes >= 4 (a gang of 2, a spare, a node to fault)")
    if not args.no_baseline:  # before Airflow is first imported
        from trainops_devcluster import airflow_home

        airflow_home.configure(Path(tempfile.mkdtemp(prefix="campaign-airflow-")), {"bench-dags": BENCH_DAGS})
        import airflow  # noqa: F401 - it configures logging on import: ours replaces it below
    level = logging.INFO if args.log else logging.ERROR
    logging.basicConfig(
        level=level, filename=args.log, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True
    )
    logging.getLogger().handlers[0].setLevel(
        level
    )  # the reconciler's INFO, kept for the checks, is not shown
    from benchmarks.campaign import FAULTS, campaign
    from benchmarks.campaign.timing import Timing

    kinds = tuple(args.kinds.split(",")) if args.kinds else FAULTS
    if unknown := set(kinds) - set(FAULTS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(FAULTS)}")

    started = time.monotonic()

    def progress(run, report) -> None:
        base = run.baseline
        lost = run.account.lost(report.setup("trainops"))
        print(
            f"run {run.index:>3} {run.fault:<22} {run.outcome[:40]:<40} landed {run.landed!s:<5} "
            f"violations {len(run.violations)}  lost GPU-s trainops {lost:7.1f}"
            + (
                f"  baseline {base.account.lost(report.setup('baseline')):7.1f} ({base.outcome})"
                if base
                else ""
            ),
            flush=True,
        )

    options = {
        "runs": args.runs,
        "seed": args.seed,
        "nodes": args.nodes,
        "scale": args.scale,
        "baseline": not args.no_baseline,
        "kinds": list(kinds),
    }
    report = campaign(
        args.runs,
        args.seed,
        nodes=args.nodes,
        timing=Timing(args.scale),
        kinds=kinds,
        baseline=not args.no_baseline,
        progress=progress,
    )
    result = {"stamp": stamp(options), **report.to_dict(), "wall_s": round(time.monotonic() - started, 1)}
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.readme:
        args.readme.write_text(written(args.readme.read_text(), result))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
