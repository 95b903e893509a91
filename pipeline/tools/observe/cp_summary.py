"""A context-parallel job's steps in words: per step (``mixflow top``, the per-step table of ``report.md``) and over
all steps (``report.md``'s summary and ``mixflow run``'s report), from ``CPStepStats``. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.tools.observe.cp_steps import CPStepStats

LISTED_RANKS = 16
"""Up to this many ranks, a step's micro-batches are listed rank by rank; past it, their least, most and median."""


def seconds_text(seconds: float | None) -> str:
    """``seconds`` at the scale that reads: ``1.23 s``, ``45.6 ms``, ``789 us``; ``-`` for None."""
    if seconds is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def blocks_text(sizes: np.ndarray, samples: np.ndarray, tokens: np.ndarray) -> str:
    """``1: 40 (3,210), 4: 1 (480)``: per block size, its samples (their tokens)."""
    parts = zip(sizes.tolist(), samples.tolist(), tokens.tolist(), strict=True)
    return ", ".join(f"{c}: {n:,} ({t:,})" for c, n, t in parts) or "none"


def micro_batches_text(micro_batches: np.ndarray) -> str:
    """A step's micro-batches a rank: ``2 2 3 3`` rank by rank, or ``2-4 (median 3)`` past ``LISTED_RANKS``."""
    counts = np.asarray(micro_batches, np.int64)
    if counts.size <= LISTED_RANKS:
        return " ".join(map(str, counts.tolist()))
    return f"{counts.min()}-{counts.max()} (median {np.median(counts):g})"


def ratio_text(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else f"{format(value, spec)}x"


STEP_COLUMNS = (
    "step",
    "samples (tokens) by block size",
    "micro-batches a rank",
    "step time",
    "over the bound",
    "static CP",
    "tokens/s over static's",
)


@dataclass(frozen=True)
class CPStepRow:
    """One context-parallel step as shown: per block size, its samples and tokens; each rank's micro-batches; the
    step's time under the job's cost and over the lower bound; static CP's block size and time (None where the
    ranks are not whole blocks of the size the step's longest sample needs) with the samples it defers, and the
    step's tokens a second over static's."""

    step: int
    blocks: list[tuple[int, int, int]]  # (block size, samples, tokens), by size
    micro_batches: list[int]  # rank by rank
    step_s: float
    bound_s: float
    over_bound: float
    static_size: int | None
    static_s: float | None
    static_deferred: int
    throughput_over_static: float | None

    @classmethod
    def of(cls, step: int, stats: CPStepStats) -> CPStepRow:
        return cls(
            step=step,
            blocks=list(zip(stats.sizes.tolist(), stats.samples_at.tolist(), stats.tokens_at.tolist(), strict=True)),
            micro_batches=stats.micro_batches.tolist(),
            step_s=stats.step_s,
            bound_s=stats.bound_s,
            over_bound=stats.over_bound,
            static_size=stats.static_size,
            static_s=stats.static_s,
            static_deferred=stats.static_deferred,
            throughput_over_static=stats.throughput_over_static,
        )

    def static_text(self) -> str:
        """``size 4: 1.23 ms, 2 deferred``, or ``none``."""
        if self.static_s is None:
            return "none"
        deferred = f", {self.static_deferred:,} deferred" if self.static_deferred else ""
        return f"size {self.static_size}: {seconds_text(self.static_s)}{deferred}"

    def cells(self) -> list[str]:
        """The step in ``STEP_COLUMNS``' order."""
        sizes, samples, tokens = (np.array([b[k] for b in self.blocks], np.int64) for k in range(3))
        return [
            str(self.step),
            blocks_text(sizes, samples, tokens),
            micro_batches_text(np.array(self.micro_batches, np.int64)),
            seconds_text(self.step_s),
            ratio_text(self.over_bound),
            self.static_text(),
            ratio_text(self.throughput_over_static, ".2f"),
        ]


@dataclass(frozen=True)
class CPSummary:
    """A context-parallel job's steps together: how its samples were split, how many micro-batches its ranks ran,
    and its step times against the lower bound and static context parallelism."""

    mode: str
    size: int  # the largest block the spec allows
    steps: list[CPStepStats]

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Over all steps, per block size used (ascending): samples and tokens."""
        sizes = np.unique(np.concatenate([s.sizes for s in self.steps] + [np.zeros(0, np.int64)]))
        samples = np.zeros(sizes.size, np.int64)
        tokens = np.zeros(sizes.size, np.int64)
        for s in self.steps:
            at = np.searchsorted(sizes, s.sizes)
            samples[at] += s.samples_at
            tokens[at] += s.tokens_at
        return sizes, samples, tokens

    def pairs(self) -> list[tuple[str, str]]:
        """(what, how much) rows; none without steps."""
        if not self.steps:
            return []
        micro = np.concatenate([s.micro_batches for s in self.steps])
        over = np.array([s.over_bound for s in self.steps])
        return [
            ("context parallelism", f"{self.mode}, blocks of up to {self.size} ranks"),
            ("samples (tokens) by block size", blocks_text(*self.blocks())),
            (
                "micro-batches a rank a step, least-most (median)",
                f"{micro.min()}-{micro.max()} ({np.median(micro):g})",
            ),
            (
                "step time under the cost model over the lower bound, median (worst)",
                f"{np.median(over):.3f}x ({over.max():.3f}x)",
            ),
            ("static CP sized for each step's longest sample", self._static()),
        ]

    def _static(self) -> str:
        had = [s for s in self.steps if s.static_s is not None]
        if not had:
            return "none: the ranks are not whole blocks of the size the longest samples need"
        time = np.array([s.static_over_written for s in had], np.float64)
        rate = np.array([s.throughput_over_static for s in had if s.throughput_over_static is not None])
        sizes = ", ".join(map(str, sorted({int(s.static_size or 0) for s in had})))
        deferred = sum(s.static_deferred for s in had)
        text = (
            f"blocks of {sizes}; its step time over the written, median {np.median(time):.3f}x (least "
            f"{time.min():.3f}x); tokens/s as written over static's, median "
            f"{np.median(rate) if rate.size else float('nan'):.2f}x; samples it defers {deferred:,}"
        )
        if len(had) < len(self.steps):
            text += f"; {len(self.steps) - len(had)} steps have none (ranks not whole blocks of their size)"
        return text


def cp_summary(steps: Sequence[CPStepStats | None], mode: str, size: int) -> CPSummary | None:
    """The summary of a job's steps; None unless every one is context-parallel."""
    if not steps or any(s is None for s in steps):
        return None
    return CPSummary(mode, size, [s for s in steps if s is not None])
