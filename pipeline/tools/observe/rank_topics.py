"""What a job's rank topics hold, summarised as its users judge it: balance, shares, exactly once.

Reads ``<job>.rank.<r>`` like a trainer would (read_committed) and compares each step's largest rank
cost with what naive per-rank loading of the same samples gives: the step's samples shuffled and dealt
round-robin to ranks, as a ``DistributedSampler`` does, so every rank gets about the same number of
samples but not the same cost. A multimodal job's rank cost has two parts, the vision encoder's and the
LLM's (``vision_parts.py``), each compared too; its naive ranks pack their samples first-fit into their
micro-batches under both capacities, tokens and patches, as one run over the job's samples (a sample that fits
none waits for its rank's next step: ``naive.py``). A
context-parallel job's steps are compared with the lower bound and with static context parallelism sized for
each step's longest sample instead (``cp_steps.py``): naive loading would leave its long samples out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.planning.mixing import Schedule
from pipeline.roles.constructor import ConstructorState
from pipeline.spec import JobSpec, OnExhausted
from pipeline.spec.cost import CostModel
from pipeline.tools.dead_letters import DEFAULT_ALLOWED_SHARE, over_share, report_lines
from pipeline.tools.delivery import SourceCheck, TrainerCheck, TrainerSummary, check_sources, check_trainer
from pipeline.tools.observe.cp_steps import CPStepStats, CPWeighing, counted_ids, cp_step_stats, no_context_parallel
from pipeline.tools.observe.cp_summary import CPSummary, cp_summary
from pipeline.tools.observe.naive import REPORT_BACKLOG_STEPS, NaiveLoading, NaiveStream
from pipeline.tools.observe.step_stats import (
    HIGH_PERCENTILE,
    imbalance,
    median_and_high,
    rank_costs,
    schedule_drift,
    tokens_by_source,
    written_parts,
    written_shape,
)
from pipeline.tools.observe.vision_parts import EncoderWeighing, RankParts, over_mean, part_bounds, step_vision
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end


@dataclass(frozen=True)
class ReportParts:
    """A multimodal job's per-step largest / mean rank cost in the vision encoder and in the LLM, as written
    and under naive per-rank loading (over its own steps), and of each part and both together at the bound (the
    least any plan of the step's samples could reach), (steps,) each."""

    weighing: EncoderWeighing  # how the encoder's part was weighed (and named)
    encoder: np.ndarray
    naive_encoder: np.ndarray
    llm: np.ndarray
    naive_llm: np.ndarray
    bound_encoder: np.ndarray
    bound_llm: np.ndarray
    bound: np.ndarray

    def lines(self) -> list[str]:
        return [
            _part_line(self.weighing.label, self.encoder, self.naive_encoder, self.bound_encoder),
            _part_line("LLM", self.llm, self.naive_llm, self.bound_llm),
        ]


def _high(balanced: np.ndarray, naive: np.ndarray) -> str:
    high, naive_high = median_and_high(balanced)[1], median_and_high(naive)[1]
    return f"{HIGH_PERCENTILE}th percentile {high:.3f} balanced, {naive_high:.3f} naive"


def _bound(bound: np.ndarray) -> str:
    median, high = median_and_high(bound)
    return f"bound {median:.3f}, {HIGH_PERCENTILE}th percentile {high:.3f}"


def _part_line(label: str, balanced: np.ndarray, naive: np.ndarray, bound: np.ndarray) -> str:
    return (
        f"  {label}: {np.median(balanced):.3f} balanced, {np.median(naive):.3f} with naive per-rank loading; "
        + _high(balanced, naive)
        + "; "
        + _bound(bound)
    )


@dataclass(frozen=True)
class JobReport:
    steps: int
    samples: int
    tokens: int
    duplicates: int
    capacity_tokens: int
    imbalance: np.ndarray  # (steps,) largest rank cost / mean rank cost, as written
    naive_imbalance: np.ndarray  # (steps,) the same for naive per-rank loading of the same samples
    naive_time: float  # naive loading's time for the same samples over the job's (``StepBalance``)
    share_error: np.ndarray  # (sources,) largest cumulative |tokens - schedule| in tokens, while all had data
    steps_with_all_sources: int  # steps before the first source ran out
    sources: list[str]
    tokens_by_source: dict[str, int]
    source_check: SourceCheck
    stops_early: bool  # the policy ends the job with samples left in the sources
    trainer_check: TrainerCheck | None = None
    trainer: TrainerSummary | None = None
    parts: ReportParts | None = None  # a multimodal job's: imbalance and naive_imbalance are of both parts
    allowed_dead_letters: float = DEFAULT_ALLOWED_SHARE  # of each source's records
    cp: CPSummary | None = None  # a context-parallel job's: imbalance of rank times, no naive loading

    @property
    def exactly_once(self) -> bool:
        """No sample repeated or lost between the sources and the rank topics, nor on the way to the trainer."""
        lost = self.source_check.missing and not self.stops_early
        trainer_ok = self.trainer_check is None or not self.trainer_check.problems
        return self.duplicates == 0 and not lost and not self.source_check.unknown and trainer_ok

    @property
    def dead_letters_within_share(self) -> bool:
        """No source lost more than ``allowed_dead_letters`` of its records to dead letters."""
        return not over_share(self.source_check.dead_letters, self.allowed_dead_letters)

    @property
    def ok(self) -> bool:
        """The verdict: exactly once, and no source lost more than its allowed share to dead letters."""
        return self.exactly_once and self.dead_letters_within_share

    def lines(self) -> list[str]:
        letters = report_lines(list(self.source_check.dead_letters), self.allowed_dead_letters)
        if self.steps == 0:
            return ["no steps written yet", *letters]
        checks = [self.source_check.line(self.stops_early)]
        if self.trainer_check is not None:
            checks.append(self.trainer_check.line())
        trainer = self.trainer.lines() if self.trainer is not None else []
        fill = self.tokens / (self.steps * self.capacity_tokens)
        shares = ", ".join(f"{s} {n / self.tokens:.1%}" for s, n in self.tokens_by_source.items())
        return [
            f"steps {self.steps}, samples {self.samples}, tokens {self.tokens} ({fill:.1%} of capacity)",
            f"each sample exactly once: {'yes' if self.duplicates == 0 else f'NO, {self.duplicates} repeated'}",
            *checks,
            *trainer,
            *(self._balance() if self.cp is None else self._context_parallel(self.cp)),
            f"token shares: {shares}",
            self._drift(),
            *letters,  # the verdict on dead letters last, where it is read
        ]

    def _drift(self) -> str:
        if self.steps_with_all_sources == 0:
            return "drift from the mixture schedule: not measured (a source ran out before the first step)"
        return (
            f"largest cumulative drift from the mixture schedule over the {self.steps_with_all_sources} steps "
            "before a source ran out, in tokens: "
            + ", ".join(f"{s} {e:.0f}" for s, e in zip(self.sources, self.share_error, strict=True))
        )

    def _balance(self) -> list[str]:
        """The balance as written against naive per-rank loading (of each part too, for a multimodal job)."""
        balance = (
            f"largest rank cost / mean, median over steps: {np.median(self.imbalance):.3f} balanced, "
            f"{np.median(self.naive_imbalance):.3f} with naive per-rank loading "
            f"(step-time speedup {self.naive_time:.2f}x)"
        )
        if self.parts is not None:
            balance += "; " + _high(self.imbalance, self.naive_imbalance) + "; " + _bound(self.parts.bound)
        return [balance, *(self.parts.lines() if self.parts is not None else [])]

    def _context_parallel(self, cp: CPSummary) -> list[str]:
        """A context-parallel job's balance of rank times, its blocks, micro-batches and step times."""
        median = np.median(self.imbalance)
        balance = f"largest rank time / mean under the cost model, median over steps: {median:.3f}"
        return [balance, *(f"{what}: {value}" for what, value in cp.pairs())]


def read_steps(config: KafkaConfig, job: str, ranks: int) -> list[list[Batch | CPBatch]]:
    """Per step, the batch of every rank, as the rank topics hold them (a context-parallel job's of format version
    2), in step order (a job of several constructor lanes has a partition per lane)."""
    topics = JobTopics(job)
    per_rank = [
        sorted(
            (
                decode_any_batch_message(m)
                for m in read_to_end(config, topics.rank(r))
                if end_of_data_steps(m.headers()) is None
            ),
            key=lambda b: b.step,
        )
        for r in range(ranks)
    ]
    steps = min(len(batches) for batches in per_rank)
    return [[per_rank[r][k] for r in range(ranks)] for k in range(steps)]


class StepBalance:
    """Per step, largest / mean rank cost as written, and under naive per-rank loading: for a text job the step's
    samples shuffled by ``seed`` and dealt round-robin, step by step; with ``encoder`` (a multimodal job's), of
    each part too, naive loading packing under both capacities as one run over the job's samples (each step's
    shuffled), what fits no micro-batch waiting for its rank's next step (``NaiveStream``: its step as each step
    is written; ``finish``, after the last step, adds the steps it needs for what still waits to its time); with
    ``cp`` (a context-parallel job's), of the ranks' times, and the step's ``CPStepStats`` instead of naive."""

    def __init__(
        self, cost: CostModel, encoder: EncoderWeighing | None, seed: int, cp: CPWeighing | None = None
    ) -> None:
        self.cost = cost
        self.encoder = encoder
        self.cp = cp
        self.rng = np.random.default_rng(seed)
        self.stream = NaiveStream(cost, REPORT_BACKLOG_STEPS)
        self.balanced: list[float] = []
        self.naive: list[float] = []  # naive loading's step as each step is written
        self.written_time = 0.0  # the sum of the steps' largest rank cost, as written
        self.naive_time = 0.0  # and naive loading's
        # encoder, LLM, and the bound of the encoder, the LLM and both
        self.by_part: list[tuple[float, ...]] = []
        self.naive_parts: list[tuple[float, float]] = []  # and its encoder and LLM parts
        self.cp_steps: list[CPStepStats] = []  # a context-parallel job's CPStepStats, step by step

    def add(self, batches: Sequence[Batch] | Sequence[CPBatch]) -> None:
        if isinstance(batches[0], CPBatch):
            if self.cp is None:
                raise no_context_parallel(batches[0])
            stats = cp_step_stats(batches, self.cp)
            self.cp_steps.append(stats)
            self.balanced.append(float(imbalance(stats.rank_times)))
            return
        lengths = np.concatenate([b.lengths for b in batches]).astype(np.int64)
        if self.encoder is None:
            written = rank_costs(batches, self.cost)
            self._written(written)
            dealt = self.rng.permutation(lengths.size) % len(batches)  # (n,) rank of each sample
            self._naive(np.bincount(dealt, weights=self.cost.costs(lengths), minlength=len(batches)))
            return
        vision = step_vision(batches, self.encoder)
        parts = written_parts(batches, self.cost, vision)
        order = self.rng.permutation(lengths.size)  # the samples in the order they are dealt
        first = batches[0]
        self._naive_step(
            self.stream.step(lengths[order], len(batches), first.micro_batches, first.capacity, vision.take(order))
        )
        self._written(parts.total(vision.in_total))
        bounds = part_bounds(lengths, self.cost.costs(lengths), vision, written_shape(batches))
        self.by_part.append(
            (
                float(imbalance(parts.encoder)),
                float(imbalance(parts.llm)),
                over_mean(bounds.encoder, parts.encoder),
                over_mean(bounds.llm, parts.llm),
                over_mean(bounds.total, parts.total(vision.in_total)),
            )
        )

    def finish(self) -> None:
        """Naive loading's time for the samples still waiting once the job's last step is added."""
        for step in self.stream.drain():
            self.naive_time += float(step.rank_costs.max())

    def _written(self, costs: np.ndarray) -> None:
        self.balanced.append(float(imbalance(costs)))
        self.written_time += float(costs.max())

    def _naive(self, costs: np.ndarray) -> None:
        self.naive.append(float(imbalance(costs)))
        self.naive_time += float(costs.max())

    def _naive_step(self, step: NaiveLoading) -> None:
        parts = step.parts or RankParts(np.zeros(len(step.rank_costs)), step.rank_costs)  # parts: given vision
        self._naive(step.rank_costs)
        self.naive_parts.append((float(imbalance(parts.encoder)), float(imbalance(parts.llm))))

    @property
    def time_over_naive(self) -> float:
        """Naive loading's time for the same samples over the job's: the sums of the steps' largest rank cost."""
        return self.naive_time / self.written_time if self.written_time > 0 else float("nan")

    def cp_summary(self) -> CPSummary | None:
        if self.cp is None:
            return None
        return cp_summary(self.cp_steps, self.cp.shape.mode.value, self.cp.shape.size)

    def parts(self) -> ReportParts | None:
        if self.encoder is None:
            return None
        encoder, llm, *bounds = np.array(self.by_part, dtype=np.float64).reshape(-1, 5).T
        naive_encoder, naive_llm = np.array(self.naive_parts, dtype=np.float64).reshape(-1, 2).T
        return ReportParts(self.encoder, encoder, naive_encoder, llm, naive_llm, *bounds)


def first_exhausted_step(config: KafkaConfig, job: str, lanes: int = 1) -> int:
    """The first step written after some source had run out (the number of steps if none ran out), over
    every constructor lane's state records (a partition each)."""
    step, first = 0, None
    for record in read_to_end(config, JobTopics(job).state):
        state = ConstructorState.from_bytes(record.value())
        if state.exhausted:
            at = state.step - lanes
            first = at if first is None else min(first, at)
        step = max(step, state.step - lanes + 1)
    return step if first is None else first


def job_report(
    config: KafkaConfig,
    spec: JobSpec,
    job: str | None = None,
    seed: int = 0,
    trainer_folder: Path | None = None,
    allowed_dead_letters: float = DEFAULT_ALLOWED_SHARE,
) -> JobReport:
    """The report on ``job`` (the spec's by default); with ``trainer_folder``, also what the trainer ranks
    recorded there (``pipeline.tools.delivery``); its verdict allows each source to lose
    ``allowed_dead_letters`` of its records to dead letters."""
    steps = read_steps(config, job or spec.job, spec.step.ranks)
    sources = spec.source_names
    balance = StepBalance(spec.cost.cost_model(), EncoderWeighing.for_spec(spec), seed, CPWeighing.for_spec(spec))
    seen: Counter[str] = Counter()
    per_source = np.zeros((len(steps), len(sources)))
    for k, batches in enumerate(steps):
        balance.add(batches)
        for b in batches:
            seen.update(counted_ids(b))
        per_source[k] = tokens_by_source(batches, sources)
    balance.finish()
    full = min(len(steps), first_exhausted_step(config, job or spec.job, spec.constructor.lanes))
    weights = Schedule.from_spec(spec.mixture, sources).weights_array(np.arange(full))  # (full, S)
    drift = schedule_drift(per_source[:full], weights)
    return JobReport(
        steps=len(steps),
        samples=sum(seen.values()),
        tokens=int(per_source.sum()),
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        capacity_tokens=spec.step.tokens_per_step,
        imbalance=np.asarray(balance.balanced),
        naive_imbalance=np.asarray(balance.naive),
        naive_time=balance.time_over_naive,
        share_error=drift,
        steps_with_all_sources=full,
        sources=sources,
        tokens_by_source={s: int(per_source[:, i].sum()) for i, s in enumerate(sources)},
        source_check=check_sources(config, job or spec.job, sources, seen),
        stops_early=spec.on_exhausted is OnExhausted.STOP,
        trainer_check=check_trainer(trainer_folder, steps) if trainer_folder is not None else None,
        trainer=TrainerSummary.read(trainer_folder) if trainer_folder is not None else None,
        parts=balance.parts(),
        allowed_dead_letters=allowed_dead_letters,
        cp=balance.cp_summary(),
    )
