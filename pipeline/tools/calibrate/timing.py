"""Timing the block forward and backward over micro-batch shapes on a torch device (the shell around ``fit``)."""

from __future__ import annotations

import itertools
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.tools.calibrate.block import Block, attention_backend
from pipeline.tools.calibrate.fit import Timing
from pipeline.tools.calibrate.grid import MicroBatchShape

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Measured:
    """The timings, and what they were measured on."""

    timings: list[Timing]
    device: str
    torch: str
    attention: str


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        model = names[0] if names else model
    threads = torch.get_num_threads()
    return f"{model} ({threads} thread{'s' if threads != 1 else ''})"


def measure(
    shapes: Sequence[MicroBatchShape],
    *,
    hidden: int,
    heads: int,
    device: str,
    dtype: str,
    repeats: int,
    warmups: int,
    progress: Callable[[str], None] | None = None,
    mlp: int | None = None,
    causal: bool = True,
) -> Measured:
    """``repeats`` times (ms) of each shape, after ``warmups`` untimed rounds. Every round times every shape
    once, so a slow spell of a shared machine spreads over all shapes instead of skewing a few. ``mlp`` and
    ``causal`` as ``Block`` takes them: ``causal=False`` times the vision encoder's block, a shape's
    ``length`` then being an image's patches."""
    torch_device, torch_dtype = torch.device(device), DTYPES[dtype]
    torch.manual_seed(0)
    attention = attention_backend(torch_device, torch_dtype, causal)
    block = Block(hidden, heads, attention, mlp=mlp, causal=causal).to(torch_device, torch_dtype)
    times: dict[MicroBatchShape, list[float]] = {shape: [] for shape in shapes}
    rounds = warmups + repeats
    for round_ in range(rounds):
        began = time.perf_counter()
        for shape in shapes:
            ms = _time_once(block, shape, torch_device, torch_dtype)
            if round_ >= warmups:
                times[shape].append(ms)
        if progress is not None:
            kind = "warm-up" if round_ < warmups else "timed"
            seconds = time.perf_counter() - began
            progress(f"round {round_ + 1}/{rounds} ({kind}): {len(shapes)} micro-batches in {seconds:.1f} s")
    timings = [Timing(shape, tuple(times[shape])) for shape in shapes]
    return Measured(timings, device_name(torch_device), torch.__version__, attention)


def _time_once(block: Block, shape: MicroBatchShape, device: torch.device, dtype: torch.dtype) -> float:
    """ms of one forward and backward of ``block`` over a micro-batch of ``shape``."""
    return time_micro_batch(block, [shape.length] * shape.samples, device, dtype)


def time_micro_batch(block: Block, lengths: Sequence[int], device: torch.device, dtype: torch.dtype) -> float:
    """ms of one forward and backward of ``block`` over one micro-batch: samples of ``lengths`` packed into
    one sequence, attention within each (as the trainer runs a planned micro-batch, or the vision encoder
    its images and clips)."""
    tokens = int(sum(lengths))
    x = torch.randn(tokens, block.hidden, device=device, dtype=dtype, requires_grad=True)
    bounds = [0, *itertools.accumulate(int(n) for n in lengths)]
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=device)
    longest = int(max(lengths))
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        block(x, cu_seqlens, longest).sum().backward()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end))
    began = time.perf_counter()
    block(x, cu_seqlens, longest).sum().backward()
    return (time.perf_counter() - began) * 1000.0
