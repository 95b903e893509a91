"""`mixflow calibrate`: time a transformer block on this machine and print the spec's `cost:` section."""

from __future__ import annotations

import argparse
import sys
from datetime import date

from pipeline.cli.arguments import output_file
from pipeline.tools.calibrate.grid import default_lengths
from topics.errors import MixflowError

# Powers of two up to a micro-batch of this many tokens, by device: a CPU is for trying the command out.
DEFAULT_LENGTHS = {"cuda": default_lengths(65536, shortest=256), "cpu": default_lengths(1024, shortest=64)}
DEFAULT_DTYPES = {"cuda": "bf16", "cpu": "fp32"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    parser.add_argument("--heads", type=int, default=32, help="attention heads (default 32)")
    parser.add_argument("--layers", type=int, default=32, help="blocks in the model: scales the cost (default 32)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when there is one, else cpu")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        help="sample lengths to time, at least 3 (default: powers of two, 256-65536 on cuda, 64-1024 on cpu)",
    )
    parser.add_argument("--tokens", type=int, help="tokens of a full micro-batch (default: the longest length)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds; the median counts (default 5)")
    parser.add_argument("--warmups", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument(
        "--threads", type=int, help="CPU threads for torch (default: torch's); 1 is steadiest on a busy machine"
    )
    parser.add_argument("--dtype", choices=tuple(DEFAULT_DTYPES.values()), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--out", type=output_file, help="also write the cost section to this file")


def _check_arguments(args: argparse.Namespace) -> None:
    for flag, value, least in (
        ("--hidden", args.hidden, 1),
        ("--heads", args.heads, 1),
        ("--layers", args.layers, 1),
        ("--repeats", args.repeats, 1),
        ("--warmups", args.warmups, 0),
        ("--threads", args.threads or 1, 1),
    ):
        if value < least:
            msg = f"{flag} must be >= {least}, got {value}"
            raise MixflowError(msg)
    if args.hidden % args.heads:
        msg = f"--hidden {args.hidden} is not a multiple of --heads {args.heads}"
        raise MixflowError(msg)


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
    from pipeline.tools.calibrate import calibration_grid, cost_section, fit_cost, fit_table
    from pipeline.tools.calibrate.section import Provenance

    try:
        import torch

        from pipeline.tools.calibrate.timing import measure
    except ImportError as exc:
        msg = f"needs torch on this machine ({exc}); install it as the trainer does"
        raise MixflowError(msg) from exc
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        msg = f"--device cuda: torch {torch.__version__} sees no CUDA device here; use --device cpu"
        raise MixflowError(msg)
    lengths = args.lengths or DEFAULT_LENGTHS[device]
    tokens = args.tokens if args.tokens is not None else max(lengths)
    try:
        shapes = calibration_grid(lengths, tokens)
    except ValueError as exc:
        msg = f"--lengths {' '.join(map(str, lengths))} with --tokens {tokens}: {exc}"
        raise MixflowError(msg) from exc
    dtype = args.dtype or DEFAULT_DTYPES[device]
    if args.threads:
        torch.set_num_threads(args.threads)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    progress(
        f"timing one block (hidden {args.hidden}, {args.heads} heads, {dtype}) on {device}, forward+backward:"
        f" {len(shapes)} micro-batches of up to {tokens} tokens, {args.warmups} warm-up + {args.repeats} rounds"
    )
    try:
        measured = measure(
            shapes,
            hidden=args.hidden,
            heads=args.heads,
            device=device,
            dtype=dtype,
            repeats=args.repeats,
            warmups=args.warmups,
            progress=progress,
        )
    except torch.OutOfMemoryError as exc:
        msg = f"out of {device} memory with micro-batches of {tokens} tokens; give a smaller --tokens ({exc})"
        raise MixflowError(msg) from exc
    try:
        fit = fit_cost(measured.timings)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc
    print(f"One block, {measured.attention} attention, ms (median of {args.repeats}):")
    for line in fit_table(fit):
        print(line)
    where = Provenance(
        device=measured.device,
        torch=measured.torch,
        dtype=dtype,
        attention=measured.attention,
        hidden=args.hidden,
        heads=args.heads,
        layers=args.layers,
        day=date.today(),
    )
    section = cost_section(fit.scaled(args.layers), where)
    print()
    print(section)
    if args.out is not None:
        try:
            args.out.write_text(section + "\n", encoding="utf-8")
        except OSError as exc:
            msg = f"--out: cannot write {args.out}: {exc}"
            raise MixflowError(msg) from exc
    return 0
