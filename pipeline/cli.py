"""The `mixflow` command line: one sub-command per role or tool, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from topics.errors import MixflowError

# Each module defines `register(subparsers)`, which adds its sub-command(s) and sets `run` on them.
COMMAND_MODULES = (
    "pipeline.stack.cli",
    "pipeline.plan_cli",
    "pipeline.load_cli",
    "pipeline.spec_cli",
    "pipeline.construct_cli",
    "pipeline.run_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixflow", description="Multi-source dataloader for large-model training on Apache Kafka."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args) or 0)
    except MixflowError as exc:
        print(f"mixflow {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
