"""Running totals of the steps in a job's rank topics, fed one batch at a time in any order of ranks:
what ``mixflow top`` shows per source (samples, tokens, the schedule's tokens) and per recent step.
Pure: no Kafka."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.spec.cost import CostModel
from pipeline.tools.observe.cp_steps import CPWeighing, counted_sources
from pipeline.tools.observe.naive import NaiveStream
from pipeline.tools.observe.step_stats import StepStats, step_stats
from pipeline.tools.observe.vision_parts import EncoderWeighing
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch

NAIVE_BACKLOG_STEPS = 8
"""Steps of a rank's tokens that naive loading (the comparison ``mixflow top`` shows) holds waiting at most."""


class StepTally:
    """A step counts once the batch of every rank has arrived. ``weights_at(step)`` (S,) gives the
    schedule's shares at a step, for the tokens the schedule asked of each source. ``recent`` holds the
    ``recent`` highest complete steps, by step: steps of several constructor lanes arrive out of order.
    ``encoder``: a multimodal job's weighing of the vision encoder (its steps' costs in two parts); ``cp``: a
    context-parallel job's shape and cost (a sample counts once, not once a slice)."""

    def __init__(
        self,
        sources: Sequence[str],
        ranks: int,
        cost: CostModel,
        weights_at: Callable[[int], np.ndarray],
        recent: int = 20,
        encoder: EncoderWeighing | None = None,
        cp: CPWeighing | None = None,
    ) -> None:
        self.sources = list(sources)
        self.ranks = ranks
        self.cost = cost
        self.weights_at = weights_at
        self.encoder = encoder
        self.cp = cp
        self.pending: dict[int, dict[int, Batch | CPBatch]] = {}
        self.steps = 0
        self.samples = np.zeros(len(self.sources), dtype=np.int64)
        self.tokens = np.zeros(len(self.sources), dtype=np.int64)
        self.scheduled = np.zeros(len(self.sources))
        self.recent_steps = recent
        self.recent: list[StepStats] = []
        # Naive loading of the steps as they complete, holding at most a few steps of samples waiting a rank.
        self.naive = NaiveStream(cost, backlog_steps=NAIVE_BACKLOG_STEPS)

    def add(self, batch: Batch | CPBatch) -> StepStats | None:
        """Take one rank's batch; the step's numbers once it is complete."""
        if batch.ranks != self.ranks:
            msg = f"step {batch.step} rank {batch.rank} has {batch.ranks} ranks, the spec {self.ranks}"
            raise ValueError(msg)
        parts = self.pending.setdefault(batch.step, {})
        parts[batch.rank] = batch
        if len(parts) < self.ranks:
            return None
        del self.pending[batch.step]
        batches = [parts[r] for r in range(self.ranks)]
        stats = step_stats(batches, self.sources, self.cost, self.encoder, self.cp, self.naive)
        self.steps += 1
        index = {s: i for i, s in enumerate(self.sources)}
        of_sample = np.array([index[s] for b in batches for s in counted_sources(b)[0]], dtype=np.int64)
        self.samples += np.bincount(of_sample, minlength=len(self.sources))
        self.tokens += stats.tokens_by_source
        self.scheduled += self.weights_at(stats.step) * stats.tokens
        bisect.insort(self.recent, stats, key=lambda s: s.step)
        if len(self.recent) > self.recent_steps:
            del self.recent[0]
        return stats
