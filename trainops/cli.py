"""The ``trainops`` command line: one entry point, one subcommand per area.

Each area module exposes ``register(subparsers)``, which adds its subcommand and sets
``func`` on its parser; ``func(args)`` returns the process exit code.  Other distributions add
areas through the ``trainops.cli`` entry point group (``trainops-devcluster`` adds ``devcluster``),
so the product never imports them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

AREAS = [
    "trainops.health.cli",
    "trainops.checkpoints.cli",
    "trainops.capacity.cli",
    "trainops.doctor.cli",
]
PLUGIN_GROUP = "trainops.cli"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainops",
        description="Operate GPU training runs on Kubernetes: node health, capacity, checkpoints.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in AREAS:
        importlib.import_module(module_name).register(subparsers)
    for plugin in sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        plugin.load()(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from trainops.errors import TemporaryError, TrainopsError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (TrainopsError, ValueError) as error:  # the message names the field or object and the fix
        print(f"trainops: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, TemporaryError) else 2


if __name__ == "__main__":
    sys.exit(main())
