"""`mixflow spec check SPEC` and `mixflow spec schema [--out FILE]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.arguments import output_file
from pipeline.cli.command import Command
from pipeline.spec import JobSpec, SpecError, SpecProblem, check_files, load_spec, spec_json_schema
from topics.errors import NotFoundError


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the job's YAML spec")
    parser.add_argument(
        "--files",
        action="store_true",
        help="also check the sources' folders or buckets, files and tokenizers, and hold the settings to them: "
        "vision token ids the tokenizer gives text, a patch budget or max_sample_length below an image or clip, "
        "fields the records lack (the first records of a few files of each source are read)",
    )


def _check(args: argparse.Namespace) -> int:
    read: list[str] = []
    try:
        spec = load_spec(args.spec)
        if args.files and (problems := _file_problems(spec, args.spec, read)):
            raise SpecError(args.spec, problems)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return NotFoundError.exit_code if isinstance(exc.__cause__, FileNotFoundError) else exc.exit_code
    unchecked = "" if args.files else "; source folders, files and tokenizers not checked: --files checks them"
    print(f"ok: {spec.job} ({summary(spec)}){unchecked}")
    if read:
        from pipeline.roles.loader.source_check import SAMPLED

        print(f"settings held to {SAMPLED}:")
        for line in read:
            print(f"  {line}")
    return 0


def _file_problems(spec: JobSpec, file: Path, read: list[str]) -> list[SpecProblem]:
    """``check_files``, then each source whose folder and tokenizer are there held to its files and tokenizer
    (``pipeline.roles.loader.source_check``); what was read of each source goes to ``read``."""
    from pipeline.roles.loader.source_check import check_source_settings

    problems = check_files(spec, file)
    found = frozenset(int(p.path.split("]", 1)[0].removeprefix("sources[")) for p in problems)
    checks = check_source_settings(spec, file, skip=found)
    read += [check.read for check in checks if check.read is not None]
    return problems + [problem for check in checks for problem in check.problems]


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
