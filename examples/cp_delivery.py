"""Every sample a context-parallel trainer received, exactly once and token for token: the slices its ranks
received, reassembled across each sample's block (the inverse zigzag, ``topics.formats.cp_slices.reassemble``),
against the samples the loaders wrote to the source topics. For ``examples/train_long_context.py``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topics.formats.cp_slices import reassemble


@dataclass(frozen=True)
class Slice:
    """One sample's slice as a rank received it."""

    rank: int
    step: int
    micro_batch: int
    sample_id: str
    cp_size: int
    cp_rank: int
    length: int  # the sample's tokens
    tokens: np.ndarray  # the slice's, padding included


def micro_batch_slices(rank: int, micro_batch: Mapping[str, Any]) -> list[Slice]:
    """The slices of a micro-batch of the sink's (``trainer_sink.cp_tensors``), sample by sample."""
    ranks = int(micro_batch["local_cp_size"])
    ends = micro_batch["cu_seqlens_padded"].numpy().astype(np.int64) // ranks
    lengths = np.diff(micro_batch["cu_seqlens"].numpy())
    tokens = micro_batch["input_ids"].numpy()
    return [
        Slice(
            rank=rank,
            step=int(micro_batch["step"]),
            micro_batch=int(micro_batch["micro_batch"]),
            sample_id=sample_id,
            cp_size=ranks,
            cp_rank=int(micro_batch["cp_rank"]),
            length=int(lengths[i]),
            tokens=tokens[ends[i] : ends[i + 1]].copy(),
        )
        for i, sample_id in enumerate(micro_batch["sample_ids"])
    ]


@dataclass(frozen=True)
class DeliveryCheck:
    samples: int  # samples received (whole or in slices)
    sources: int  # samples on the source topics
    to_the_end: bool  # the trainer trained every step of the job
    by_block: Counter[int] = field(default_factory=Counter)  # samples by the ranks of their block
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        blocks = ", ".join(f"{n} on {c} rank{'s' if c > 1 else ''}" for c, n in sorted(self.by_block.items()))
        what = (
            f"{self.samples} of the sources' {self.sources} samples"
            if self.to_the_end
            else f"{self.samples} samples of the steps trained; the sources hold {self.sources}"
        )
        if self.ok:
            return f"every sample received exactly once, token for token: yes ({what}: {blocks})"
        more = len(self.problems) - 3
        shown = "; ".join(self.problems[:3]) + (f"; and {more} more" if more > 0 else "")
        return f"every sample received exactly once, token for token: NO ({shown})"


def check_delivery(slices: Iterable[Slice], sources: Mapping[str, np.ndarray], *, to_the_end: bool) -> DeliveryCheck:
    """Group ``slices`` by sample: each sample's block must have sent each of its places once, from consecutive
    ranks, in one micro-batch of one step, and the reassembled tokens must be the source's. With ``to_the_end``,
    every source sample must have arrived."""
    by_sample: dict[str, list[Slice]] = defaultdict(list)
    for piece in slices:
        by_sample[piece.sample_id].append(piece)
    problems: list[str] = []
    by_block: Counter[int] = Counter()
    for sample_id, pieces in sorted(by_sample.items()):
        if (problem := _sample_problem(sample_id, pieces, sources)) is not None:
            problems.append(problem)
        else:
            by_block[pieces[0].cp_size] += 1
    if to_the_end and (missing := sorted(sources.keys() - by_sample.keys())):
        problems.append(f"{len(missing)} source samples never arrived (the first: {missing[0]})")
    return DeliveryCheck(len(by_sample), len(sources), to_the_end, by_block, problems)


def _sample_problem(sample_id: str, pieces: Sequence[Slice], sources: Mapping[str, np.ndarray]) -> str | None:
    c = pieces[0].cp_size
    places = sorted(p.cp_rank for p in pieces)
    if any(p.cp_size != c for p in pieces) or places != list(range(c)):
        return f"{sample_id}: places {places} of a block of {c} ranks arrived"
    if len({(p.rank - p.cp_rank, p.step, p.micro_batch) for p in pieces}) != 1:
        return f"{sample_id}: its slices arrived on ranks, steps or micro-batches of different blocks"
    expected = sources.get(sample_id)
    if expected is None:
        return f"{sample_id}: no source topic holds it"
    ordered = sorted(pieces, key=lambda p: p.cp_rank)
    try:
        whole = reassemble([p.tokens for p in ordered], ordered[0].length)
    except ValueError as exc:
        return f"{sample_id}: {exc}"
    if whole.size != expected.size or not np.array_equal(whole, expected):
        return f"{sample_id}: its slices make {whole.size} tokens other than the source's {expected.size}"
    return None
