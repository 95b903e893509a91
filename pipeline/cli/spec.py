"""`mixflow spec check SPEC` and `mixflow spec schema [--out FILE]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.arguments import output_file
from pipeline.cli.command import Command
from pipeline.spec import JobSpec, SpecError, check_files, load_spec, spec_json_schema
from topics.errors import NotFoundError


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the job's YAML spec")
    parser.add_argument(
        "--files", action="store_true", help="also check that source folders, their files and tokenizers exist"
    )


def _check(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
        if args.files and (problems := check_files(spec, args.spec) + _object_store_problems(spec, args.spec)):
            raise SpecError(args.spec, problems)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return NotFoundError.exit_code if isinstance(exc.__cause__, FileNotFoundError) else exc.exit_code
    unchecked = "" if args.files else "; source folders, files and tokenizers not checked: --files checks them"
    print(f"ok: {spec.job} ({summary(spec)}){unchecked}")
    return 0


def _object_store_problems(spec: JobSpec, file: Path) -> list:
    if not any(source.in_object_store for source in spec.sources):
        return []
    from pipeline.roles.loader.source_storage import check_object_sources

    return check_object_sources(spec, file)


def summary(spec: JobSpec) -> str:
    """One line: sources, step shape, mixture."""
    step = spec.step
    points = len(spec.mixture.points())
    mixture = (
        f"curriculum of {points} points, {spec.mixture.interpolation}" if spec.mixture.schedule else "fixed weights"
    )
    return (
        f"{len(spec.sources)} sources, {step.ranks} ranks x {step.micro_batches} micro-batches x "
        f"{step.tokens_per_micro_batch} tokens = {step.tokens_per_step} tokens per step, {mixture}"
    )


def _add_schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_file, help="write it to this file instead")


def _schema(args: argparse.Namespace) -> int:
    text = json.dumps(spec_json_schema(), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


ACTIONS = (
    Command(
        name="check",
        help="validate a job spec and list every problem",
        add_arguments=_add_check_arguments,
        run=_check,
    ),
    Command(
        name="schema",
        help="print the JSON schema of a job spec",
        add_arguments=_add_schema_arguments,
        run=_schema,
    ),
)
ACTION_DEST = "spec_command"
