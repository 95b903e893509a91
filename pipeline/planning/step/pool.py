"""The samples the constructor holds between reading and delivering them: a FIFO per source in offset
order, and the samples the scheduler deferred, in their priority order. Pure: no Kafka.

Each sample's vision patches (``Sample.patches``) and encoder cost (the sum over its images and clips,
``VisionCostModel.sample_costs``, computed once as it arrives) are kept beside its length; once a sample
with media has arrived, the pool's windows carry them (``StepWindow.patches``, ``encoder_costs``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.planning.order import candidate_order
from pipeline.planning.step.core import StepWindow
from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition
from pipeline.spec.cost import VisionCostModel
from topics.formats.sample import Sample


@dataclass(frozen=True)
class Candidate:
    ref: SampleRef
    sample: Sample
    encoder_cost: float = 0.0


def held_bytes(sample: Sample) -> int:
    """The bytes a sample holds in the look-ahead: its tokens and its media's frames."""
    return sample.tokens.nbytes + sum(len(frame) for item in sample.media for frame in item.frames)


def encoder_cost(sample: Sample, vision: VisionCostModel | None) -> float:
    """The sample's cost in the vision encoder: 0 for text, or without a vision cost model."""
    if vision is None or not sample.media:
        return 0.0
    return vision.sample_cost(item.patches for item in sample.media)


class SourceFifo:
    """One source's samples read but not drawn, in offset order."""

    def __init__(self, position: SourcePosition) -> None:
        self.offsets: list[int] = []
        self.samples: list[Sample] = []
        self.lengths: list[int] = []
        self.patches: list[int] = []
        self.encoder_costs: list[float] = []
        self.sizes: list[int] = []  # held_bytes of each sample
        self.next_offset = position.low  # the next offset to read
        self.delivered: set[int] = set(position.used)  # delivered (or dead-lettered) offsets >= low
        self.read_tokens = self.read_samples = 0  # samples read into it so far (for metrics)
        self._tokens = 0  # sum(lengths)
        self._bytes = 0  # sum(sizes)

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def bytes(self) -> int:
        return self._bytes

    def append(self, offset: int, sample: Sample, encoder_cost: float = 0.0) -> None:
        length = sample.length
        self.offsets.append(offset)
        self.samples.append(sample)
        self.lengths.append(length)
        self.patches.append(sample.patches if sample.media else 0)
        self.encoder_costs.append(encoder_cost)
        size = held_bytes(sample)
        self.sizes.append(size)
        self._tokens += length
        self._bytes += size

    def take(self, positions: np.ndarray) -> list[Candidate]:
        """Remove and return the samples at ``positions`` (indices into the FIFO), in that order."""
        if positions.size == 0:
            return []
        picked = positions.tolist()
        out = [
            Candidate(SampleRef(self.samples[i].source, self.offsets[i]), self.samples[i], self.encoder_costs[i])
            for i in picked
        ]
        self._tokens -= sum(self.lengths[i] for i in picked)
        self._bytes -= sum(self.sizes[i] for i in picked)
        columns = ("offsets", "samples", "lengths", "patches", "encoder_costs", "sizes")
        if np.array_equal(positions, np.arange(len(picked))):  # the head: what an in-order draw takes
            for name in columns:
                del getattr(self, name)[: len(picked)]
            return out
        keep = np.ones(len(self.offsets), dtype=bool)
        keep[positions] = False
        kept = np.flatnonzero(keep).tolist()
        for name in columns:
            column = getattr(self, name)
            setattr(self, name, [column[i] for i in kept])
        return out


class SamplePool:
    """Every source's FIFO and the deferred samples, with the positions a checkpoint records."""

    def __init__(self, state: ConstructorState, vision: VisionCostModel | None = None) -> None:
        self.vision = vision
        self.multimodal = False  # a sample with media has arrived: windows carry patches and encoder costs
        self.sources = list(state.positions)
        self.fifos = {s: SourceFifo(state.positions[s]) for s in self.sources}
        self.deferred: list[Candidate] = []
        # Deferred samples of the checkpoint, found again while re-reading their sources.
        self._pending_refs = list(state.deferred)
        self._pending = set(self._pending_refs)
        self._found: dict[SampleRef, Sample] = {}

    # -- reading ---------------------------------------------------------------------------------

    def add(self, source: str, offset: int, sample: Sample | None) -> None:
        """A record read at ``offset``; None for one that could not be decoded (it is dead-lettered)."""
        fifo = self.fifos[source]
        fifo.next_offset = offset + 1
        if offset in fifo.delivered:
            return
        if sample is None:
            fifo.delivered.add(offset)
            return
        fifo.read_tokens += sample.length
        fifo.read_samples += 1
        if sample.media:
            self.multimodal = True
        if self._pending and (ref := SampleRef(source, offset)) in self._pending:
            self._found[ref] = sample
            self._resolve_pending()
            return
        fifo.append(offset, sample, encoder_cost(sample, self.vision) if sample.media else 0.0)

    def waiting_for_deferred(self) -> dict[str, int]:
        """Sources whose checkpointed deferred samples are not read again yet: the offset to reach."""
        out: dict[str, int] = {}
        for ref in self._pending_refs:
            if ref not in self._found:
                out[ref.source] = max(out.get(ref.source, -1), ref.offset)
        return out

    def _resolve_pending(self) -> None:
        if all(ref in self._found for ref in self._pending_refs):
            found = [(ref, self._found[ref]) for ref in self._pending_refs]
            self.deferred = [Candidate(ref, s, encoder_cost(s, self.vision)) for ref, s in found] + self.deferred
            self._pending_refs, self._pending, self._found = [], set(), {}

    # -- drawing ----------------------------------------------------------------------------------

    def window(self, with_sizes: bool = False) -> StepWindow:
        """What the next step is drawn from: each source's FIFO lengths and the deferred samples, and once
        samples with media have arrived, the patches and encoder costs of each; ``with_sizes``: each sample's
        bytes too (for a composition with ``window_bytes``; built only then, a step's arrays being per sample)."""
        available = {s: np.asarray(f.lengths, dtype=np.int64) for s, f in self.fifos.items()}
        index = {s: k for k, s in enumerate(self.sources)}
        n = len(self.deferred)
        deferred_source = np.fromiter((index[c.ref.source] for c in self.deferred), np.int64, n)
        deferred_lengths = np.fromiter((c.sample.length for c in self.deferred), np.int64, n)
        sizes = {s: np.asarray(f.sizes, dtype=np.int64) for s, f in self.fifos.items()} if with_sizes else None
        if not self.multimodal:
            return StepWindow(available, deferred_source, deferred_lengths, sizes=sizes)
        return StepWindow(
            available,
            deferred_source,
            deferred_lengths,
            {s: np.asarray(f.patches, dtype=np.int64) for s, f in self.fifos.items()},
            {s: np.asarray(f.encoder_costs, dtype=np.float64) for s, f in self.fifos.items()},
            np.fromiter((c.sample.patches for c in self.deferred), np.int64, n),
            np.fromiter((c.encoder_cost for c in self.deferred), np.float64, n),
            sizes,
        )

    def take(self, positions: Mapping[str, np.ndarray], order: np.ndarray | None = None) -> list[Candidate]:
        """The step's candidates: the deferred samples, then those at ``positions`` of each source's FIFO
        (removed from it), in ``order`` (``PlannedStep.order``), by default ``candidate_order``'s."""
        old, self.deferred = self.deferred, []
        drawn = [self.fifos[s].take(np.asarray(positions.get(s, []), dtype=np.int64)) for s in self.sources]
        if order is None:
            lengths = [np.fromiter((c.sample.length for c in d), np.int64, len(d)) for d in drawn]
            order = candidate_order(len(old), lengths)
        numbered = [*old, *(c for candidates in drawn for c in candidates)]
        return [numbered[i] for i in order.tolist()]

    def settle(self, delivered: Iterable[Candidate], deferred: list[Candidate]) -> None:
        """Record what a step delivered and put its deferred samples back, first in line."""
        for c in delivered:
            self.fifos[c.ref.source].delivered.add(c.ref.offset)
        self.deferred = deferred
        for s, position in self.positions().items():
            self.fifos[s].delivered = set(position.used)

    def empty(self) -> bool:
        return not self.deferred and not self._pending_refs and all(not f.offsets for f in self.fifos.values())

    def positions(self) -> dict[str, SourcePosition]:
        """Per source, the first offset not delivered and the delivered offsets above it."""
        held: dict[str, list[int]] = {s: [] for s in self.sources}
        for c in self.deferred:
            held[c.ref.source].append(c.ref.offset)
        for ref in self._pending_refs:
            held[ref.source].append(ref.offset)
        out = {}
        for s, fifo in self.fifos.items():
            low = min([fifo.next_offset, *held[s], *fifo.offsets[:1]])
            out[s] = SourcePosition(low, tuple(sorted(o for o in fifo.delivered if o >= low)))
        return out

    def deferred_refs(self) -> tuple[SampleRef, ...]:
        return tuple(c.ref for c in self.deferred) + tuple(self._pending_refs)

    def tokens_held(self) -> Mapping[str, int]:
        return {s: f.tokens for s, f in self.fifos.items()}

    def bytes_held(self) -> Mapping[str, int]:
        return {s: f.bytes for s, f in self.fifos.items()}
