"""`mixflow calibrate`: time a transformer block on this machine and print the spec's `cost:` section; with
`--vision`, the vision encoder's block too, and the section's `vision:` part."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from pipeline.cli.arguments import output_file
from pipeline.tools.calibrate.grid import MicroBatchShape, calibration_grid, default_lengths
from topics.errors import MixflowError

if TYPE_CHECKING:
    from pipeline.tools.calibrate.fit import CostFit
    from pipeline.tools.calibrate.section import VisionPart
    from pipeline.tools.calibrate.timing import Measured

# Powers of two up to a micro-batch of this many tokens, by device: a CPU is for trying the command out.
DEFAULT_LENGTHS = {"cuda": default_lengths(65536, shortest=256), "cpu": default_lengths(1024, shortest=64)}
# The same for the vision encoder, in patches of one image or clip (Qwen2-VL: 14 px, before the 2x2 merge).
DEFAULT_VISION_PATCHES = {"cuda": default_lengths(16384, shortest=64), "cpu": default_lengths(1024, shortest=64)}
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
    vision = parser.add_argument_group("the vision encoder (a ViT: full attention within each image or clip)")
    vision.add_argument(
        "--vision",
        action="store_true",
        help="also time the encoder's block over packed images and print the cost section's vision: part",
    )
    vision.add_argument("--vision-hidden", type=int, default=1280, help="its hidden size (default 1280, Qwen2-VL's)")
    vision.add_argument("--vision-heads", type=int, default=16, help="its attention heads (default 16)")
    vision.add_argument("--vision-mlp", type=int, help="its MLP width (default 4 x --vision-hidden)")
    vision.add_argument("--vision-layers", type=int, default=32, help="its blocks: scales its cost (default 32)")
    vision.add_argument(
        "--vision-patches",
        type=int,
        nargs="+",
        help="patches of one image or clip to time, at least 3 (default: powers of two, 64-16384 on cuda, 64-1024"
        " on cpu)",
    )
    vision.add_argument(
        "--vision-micro-batch", type=int, help="patches of a full micro-batch (default: the most of --vision-patches)"
    )


def _check_arguments(args: argparse.Namespace) -> None:
    for flag, value, least in (
        ("--hidden", args.hidden, 1),
        ("--heads", args.heads, 1),
        ("--layers", args.layers, 1),
        ("--repeats", args.repeats, 1),
        ("--warmups", args.warmups, 0),
        ("--threads", args.threads or 1, 1),
        ("--vision-hidden", args.vision_hidden, 1),
        ("--vision-heads", args.vision_heads, 1),
        ("--vision-mlp", args.vision_mlp or 1, 1),
        ("--vision-layers", args.vision_layers, 1),
    ):
        if value < least:
            msg = f"{flag} must be >= {least}, got {value}"
            raise MixflowError(msg)
    for hidden, heads, value, by in (
        ("--hidden", "--heads", args.hidden, args.heads),
        ("--vision-hidden", "--vision-heads", args.vision_hidden, args.vision_heads),
    ):
        if value % by:
            msg = f"{hidden} {value} is not a multiple of {heads} {by}"
            raise MixflowError(msg)


@dataclass(frozen=True)
class _Timed:
    """One block to time: its shape, its micro-batches, and how messages name them."""

    what: str
    hidden: int
    heads: int
    mlp: int | None
    causal: bool
    shapes: list[MicroBatchShape]
    most: str  # a full micro-batch: "32768 tokens", "16384 patches"
    smaller: str  # the flag that makes micro-batches smaller


def _grid(lengths: Sequence[int], total: int | None, flags: tuple[str, str]) -> tuple[list[MicroBatchShape], int]:
    total = total if total is not None else max(lengths)
    try:
        return calibration_grid(lengths, total), total
    except ValueError as exc:
        msg = f"{flags[0]} {' '.join(map(str, lengths))} with {flags[1]} {total}: {exc}"
        raise MixflowError(msg) from exc


def _llm_block(args: argparse.Namespace, device: str) -> _Timed:
    shapes, tokens = _grid(args.lengths or DEFAULT_LENGTHS[device], args.tokens, ("--lengths", "--tokens"))
    return _Timed(
        what="one block",
        hidden=args.hidden,
        heads=args.heads,
        mlp=None,
        causal=True,
        shapes=shapes,
        most=f"{tokens} tokens",
        smaller="--tokens",
    )


def _vision_block(args: argparse.Namespace, device: str) -> _Timed:
    patches = args.vision_patches or DEFAULT_VISION_PATCHES[device]
    shapes, most = _grid(patches, args.vision_micro_batch, ("--vision-patches", "--vision-micro-batch"))
    return _Timed(
        what="the vision encoder's block",
        hidden=args.vision_hidden,
        heads=args.vision_heads,
        mlp=args.vision_mlp or 4 * args.vision_hidden,
        causal=False,
        shapes=shapes,
        most=f"{most} patches",
        smaller="--vision-micro-batch",
    )


def _time_block(timed: _Timed, args: argparse.Namespace, device: str, dtype: str) -> tuple[Measured, CostFit]:
    """The block's ``Measured`` times and their ``CostFit`` (per item, one block)."""
    import torch

    from pipeline.tools.calibrate.fit import fit_cost
    from pipeline.tools.calibrate.timing import measure

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    mlp = f", MLP {timed.mlp}" if timed.mlp is not None else ""
    progress(
        f"timing {timed.what} (hidden {timed.hidden}, {timed.heads} heads{mlp}, {dtype}) on {device},"
        f" forward+backward: {len(timed.shapes)} micro-batches of up to {timed.most},"
        f" {args.warmups} warm-up + {args.repeats} rounds"
    )
    try:
        measured = measure(
            timed.shapes,
            hidden=timed.hidden,
            heads=timed.heads,
            device=device,
            dtype=dtype,
            repeats=args.repeats,
            warmups=args.warmups,
            progress=progress,
            mlp=timed.mlp,
            causal=timed.causal,
        )
    except torch.OutOfMemoryError as exc:
        msg = f"out of {device} memory with micro-batches of {timed.most}; give a smaller {timed.smaller} ({exc})"
        raise MixflowError(msg) from exc
    try:
        return measured, fit_cost(measured.timings)
    except ValueError as exc:
        raise MixflowError(str(exc)) from exc


def _device(requested: str | None) -> str:
    try:
        import torch

        import pipeline.tools.calibrate.timing  # noqa: F401  (torch's parts of the tool import here)
    except ImportError as exc:
        msg = f"needs torch on this machine ({exc}); install it as the trainer does"
        raise MixflowError(msg) from exc
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        msg = f"--device cuda: torch {torch.__version__} sees no CUDA device here; use --device cpu"
        raise MixflowError(msg)
    return device


def _vision_part(timed: _Timed, measured: Measured, fit: CostFit, args: argparse.Namespace) -> VisionPart:
    """Prints the encoder's table; its fit for all its layers, as the section takes it."""
    from pipeline.tools.calibrate.section import VisionPart, fit_table

    print(f"\nThe vision encoder's block, {measured.attention} attention, ms (median of {args.repeats}):")
    for line in fit_table(fit, length="n", count="images"):
        print(line)
    layers = args.vision_layers
    return VisionPart(fit.scaled(layers), timed.hidden, timed.heads, timed.mlp or 0, layers, measured.attention)


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
    from pipeline.tools.calibrate.section import Provenance, cost_section, fit_table

    device = _device(args.device)
    blocks = [_llm_block(args, device)] + ([_vision_block(args, device)] if args.vision else [])
    dtype = args.dtype or DEFAULT_DTYPES[device]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    measured, fit = _time_block(blocks[0], args, device, dtype)
    vision_timed = _time_block(blocks[1], args, device, dtype) if args.vision else None
    print(f"One block, {measured.attention} attention, ms (median of {args.repeats}):")
    for line in fit_table(fit):
        print(line)
    vision = None if vision_timed is None else _vision_part(blocks[1], *vision_timed, args)
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
    section = cost_section(fit.scaled(args.layers), where, vision)
    print()
    print(section)
    if args.out is not None:
        try:
            args.out.write_text(section + "\n", encoding="utf-8")
        except OSError as exc:
            msg = f"--out: cannot write {args.out}: {exc}"
            raise MixflowError(msg) from exc
    return 0
