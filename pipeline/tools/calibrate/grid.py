"""Which micro-batches to time: for each sample length, a full micro-batch and a half-full one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_LENGTHS = 3


@dataclass(frozen=True, order=True)
class MicroBatchShape:
    """A packed micro-batch of ``samples`` samples of ``length`` tokens each."""

    length: int
    samples: int

    @property
    def tokens(self) -> int:
        return self.length * self.samples


def default_lengths(longest: int, shortest: int) -> list[int]:
    """Powers of two from ``shortest`` up to ``longest``."""
    lengths, length = [], shortest
    while length <= longest:
        lengths.append(length)
        length *= 2
    return lengths


def calibration_grid(lengths: Sequence[int], tokens: int) -> list[MicroBatchShape]:
    """Per length ``L``: ``tokens // L`` samples, and half as many.

    Micro-batches of one length with two sizes tell a cost per sample from a cost per micro-batch (a
    fixed cost of the step, the same on every rank); all of one size would fold the latter into beta.
    """
    if tokens < 1:
        msg = f"tokens must be >= 1, got {tokens}"
        raise ValueError(msg)
    distinct = sorted(set(lengths))
    if len(distinct) < MIN_LENGTHS:
        msg = f"need at least {MIN_LENGTHS} different lengths to fit alpha, beta and gamma, got {list(lengths)}"
        raise ValueError(msg)
    for length in distinct:
        if length < 1 or length > tokens:
            msg = f"length {length} is not within 1..{tokens} (the tokens of a micro-batch)"
            raise ValueError(msg)
    shapes = {MicroBatchShape(L, n) for L in distinct for n in (tokens // L, max(1, tokens // (2 * L)))}
    return sorted(shapes)
