"""``trainops checkpoints verify URI`` and ``trainops checkpoints latest RUN_URI``."""

from __future__ import annotations

import argparse
import json
import sys

from trainops.checkpoints.formats.base import LEVELS, METADATA


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "checkpoints", help="verify checkpoints in S3 and find the latest good one"
    )
    commands = parser.add_subparsers(dest="checkpoints_command", required=True, metavar="COMMAND")

    verify = commands.add_parser("verify", help="verify one checkpoint (exit 0 verified, 1 not)")
    verify.add_argument("uri", help="the checkpoint directory, s3://bucket/runs/<run>/step-N/")
    verify.set_defaults(func=_verify)

    latest = commands.add_parser("latest", help="the newest verified checkpoint under a run path")
    latest.add_argument("run_uri", help="the run path, s3://bucket/runs/<run>/")
    latest.set_defaults(func=_latest)

    for command in (verify, latest):
        command.add_argument(
            "--level", choices=LEVELS, default=METADATA, help="how deep to check (default: %(default)s)"
        )
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        command.add_argument(
            "--endpoint-url", help="S3 endpoint (default: boto3's, e.g. AWS_ENDPOINT_URL_S3)"
        )


def _bad_input(error: ValueError) -> int:
    print(f"trainops checkpoints: error: {error}", file=sys.stderr)
    return 2


def _verify(args: argparse.Namespace) -> int:
    from trainops.checkpoints.store import CheckpointStore
    from trainops.checkpoints.verify import verify_checkpoint

    try:
        result = verify_checkpoint(
            args.uri, level=args.level, store=CheckpointStore(endpoint_url=args.endpoint_url)
        )
    except ValueError as error:
        return _bad_input(error)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.summary())
        for reason in result.reasons:
            print(f"  - {reason}")
    return 0 if result.ok else 1


def _latest(args: argparse.Namespace) -> int:
    from trainops.checkpoints.latest import latest_verified
    from trainops.checkpoints.store import CheckpointStore

    try:
        result = latest_verified(
            args.run_uri, level=args.level, store=CheckpointStore(endpoint_url=args.endpoint_url)
        )
    except ValueError as error:
        return _bad_input(error)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        for skipped in result.skipped:
            print(f"skipped {skipped.uri}: {'; '.join(skipped.reasons)}")
        print(
            result.checkpoint.summary()
            if result.checkpoint
            else f"no verified checkpoint under {result.run_uri}"
        )
    return 0 if result.checkpoint else 1
