"""The ``trainops`` command line: one entry point, one subcommand per area.

Each area module exposes ``register(subparsers)``, which adds its subcommand and sets
``func`` on its parser; ``func(args)`` returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

AREAS = [
    "trainops.devcluster.cli",
    "trainops.health.cli",
    "trainops.checkpoints.cli",
    "trainops.cluster.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainops",
        description="Operate GPU training runs on Kubernetes: node health, capacity, checkpoints, devcluster.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in AREAS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
