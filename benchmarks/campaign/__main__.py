"""``python -m benchmarks.campaign --runs 200 --seed 1 --json benchmarks/campaign.json``: the table."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from benchmarks.campaign import campaign


def table(result: dict) -> str:
    lines = [
        f"runs {result['runs']}  seed {result['seed']}  wall {result['wall_s']} s  succeeded {result['succeeded']}"
    ]
    recover = result["recover_s_by_fault"]
    lines += [
        f"  fault {kind:<22} {count:>4}" + (f"  recover {recover[kind]} s" if kind in recover else "")
        for kind, count in result["faults"].items()
    ]
    lines.append(
        f"violations {result['violations']}  goodput {result['goodput']} "
        f"({result['useful_steps']} useful / {result['paid_steps']} paid steps)  "
        f"median time to recover {result['median_recover_s']} s"
    )
    lines += ["  " + line for line in result["violation_details"]]
    lines += ["  " + line for line in result["failed"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.campaign", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--log", type=Path, help="the procedures' log (INFO) goes here; else errors only")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.log else logging.ERROR,
        filename=args.log,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    started = time.monotonic()

    def progress(run) -> None:
        print(
            f"run {run.index:>3} {run.fault:<22} {run.outcome[:80]:<80} violations {len(run.violations)}",
            flush=True,
        )

    result = campaign(args.runs, args.seed, progress=progress).to_dict()
    result["seed"], result["wall_s"] = args.seed, round(time.monotonic() - started, 1)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
