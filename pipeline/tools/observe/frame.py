"""``mixflow top``'s frame: from the facts collected about a job at one moment (``JobFacts``) to the
numbers shown (``Frame``), and from those to rich tables. Pure: no Kafka.

Rates are records (or steps) seen in the last ``window_s`` seconds, divided by it, so a single look at
the topics gives them and a job that stopped shows 0. Source records are counted by offsets, which a
transaction marker also takes (one per loader work unit, of many samples).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipeline.tools.dead_letters import tally
from pipeline.tools.observe.cp_summary import STEP_COLUMNS, CPStepRow
from pipeline.tools.observe.step_stats import StepStats

REASON_WIDTH = 80


@dataclass(frozen=True)
class SourceFacts:
    name: str
    end_offset: int | None  # past each partition's last committed record, summed; None before the topic exists
    recent_records: int  # records written to the source topic (all partitions) in the last window
    mean_sample_tokens: float | None  # over the latest samples of the topic; None when it is empty
    delivered_offsets: int | None  # offsets the lanes' last state records say are delivered; None before any
    loaders: int | None  # members of the source's loader group; None when it could not be described
    samples: int  # samples of the source in the rank topics so far
    tokens: int  # their tokens
    scheduled_tokens: float  # tokens the schedule asked of the source over the same steps


@dataclass(frozen=True)
class JobFacts:
    job: str
    window_s: float
    sources: Sequence[SourceFacts]
    schedule_now: Mapping[str, float]  # each source's share at the next step
    next_step: int  # one past the highest step any lane has written: the steps written so far
    recent_state_steps: int  # steps committed in the last window, by every lane
    finished: bool
    recent: Sequence[StepStats]  # the latest complete steps in the rank topics, oldest first
    sink_steps: Sequence[int] | None  # the step each rank's sink is at; None when no endpoint said
    dead_letters: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (source, reason) -> records


@dataclass(frozen=True)
class SourceRow:
    name: str
    samples_per_s: float
    tokens_per_s: float | None
    backlog: int | None  # offsets written to the source topic and not yet delivered
    loaders: int | None
    samples: int
    tokens: int
    share: float | None  # of the tokens delivered so far
    scheduled_share: float | None  # the schedule's share of the same steps' tokens
    share_now: float  # the schedule's share at the next step


@dataclass(frozen=True)
class ConstructorRow:
    steps_written: int
    steps_per_s: float
    lead: int | None  # steps written ahead of the slowest rank's sink; None: unknown
    recent_steps: int  # the steps the next four are over
    imbalance_median: float | None
    imbalance_max: float | None
    naive_imbalance_median: float | None
    fill_mean: float | None
    finished: bool


@dataclass(frozen=True)
class PartRow:
    """A multimodal job's balance of one part of the rank cost over the recent steps: largest / mean rank
    cost, as written (median and worst), at the bound, the least any plan of each step's samples could reach
    (median and worst), and under naive per-rank loading (median)."""

    part: str
    imbalance_median: float
    imbalance_max: float
    naive_imbalance_median: float
    bound_median: float
    bound_max: float


@dataclass(frozen=True)
class DeadLetterRow:
    source: str
    reason: str
    records: int


@dataclass(frozen=True)
class Frame:
    job: str
    window_s: float
    sources: list[SourceRow]
    constructor: ConstructorRow
    # Every source's, its most frequent reason kinds first (REASONS_SHOWN, then one row counting the others)
    dead_letters: list[DeadLetterRow]
    dead_letters_total: int
    parts: list[PartRow] = field(default_factory=list)  # a multimodal job's: encoder + LLM, encoder, LLM
    context_parallel: list[CPStepRow] = field(default_factory=list)  # a context-parallel job's recent steps

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.parts:  # a text job's frame has no parts
            del out["parts"]
        if not self.context_parallel:  # nor, without context parallelism, steps of it
            del out["context_parallel"]
        return out


def source_row(
    facts: SourceFacts, window_s: float, total_tokens: int, total_scheduled: float, share_now: float
) -> SourceRow:
    rate = facts.recent_records / window_s
    backlog = None
    if facts.end_offset is not None:
        backlog = max(0, facts.end_offset - (facts.delivered_offsets or 0))
    return SourceRow(
        name=facts.name,
        samples_per_s=rate,
        tokens_per_s=rate * facts.mean_sample_tokens if facts.mean_sample_tokens is not None else None,
        backlog=backlog,
        loaders=facts.loaders,
        samples=facts.samples,
        tokens=facts.tokens,
        share=facts.tokens / total_tokens if total_tokens else None,
        scheduled_share=facts.scheduled_tokens / total_scheduled if total_scheduled else None,
        share_now=share_now,
    )


def constructor_row(facts: JobFacts) -> ConstructorRow:
    recent = list(facts.recent)
    lead = None
    if facts.sink_steps:
        lead = max(0, facts.next_step - 1 - min(facts.sink_steps))
    imbalance = np.array([s.imbalance for s in recent])
    naive = [s for s in recent if s.naive is not None]  # a context-parallel step has none
    return ConstructorRow(
        steps_written=facts.next_step,
        steps_per_s=facts.recent_state_steps / facts.window_s,
        lead=lead,
        recent_steps=len(recent),
        imbalance_median=float(np.median(imbalance)) if recent else None,
        imbalance_max=float(imbalance.max()) if recent else None,
        naive_imbalance_median=float(np.median([s.naive_imbalance for s in naive])) if naive else None,
        fill_mean=float(np.mean([s.fill for s in recent])) if recent else None,
        finished=facts.finished,
    )


def part_rows(recent: Sequence[StepStats]) -> list[PartRow]:
    """The balance of each part of the recent steps' rank costs; none for steps of a text job."""
    encoder = recent[-1].encoder if recent else None
    if encoder is None:
        return []
    rows = []
    for part, balanced, bound, naive in (
        (
            encoder.total_label,
            [s.imbalance for s in recent],
            [s.bound_imbalance for s in recent],
            [s.naive_imbalance for s in recent],
        ),
        (
            encoder.label,
            [s.encoder_imbalance for s in recent],
            [s.encoder_bound_imbalance for s in recent],
            [s.naive_encoder_imbalance for s in recent],
        ),
        (
            "LLM",
            [s.llm_imbalance for s in recent],
            [s.llm_bound_imbalance for s in recent],
            [s.naive_llm_imbalance for s in recent],
        ),
    ):
        values, bounds = np.array(balanced, dtype=np.float64), np.array(bound, dtype=np.float64)
        median, worst, naive_median = float(np.median(values)), float(values.max()), float(np.median(naive))
        rows.append(PartRow(part, median, worst, naive_median, float(np.median(bounds)), float(bounds.max())))
    return rows


def cp_rows(recent: Sequence[StepStats]) -> list[CPStepRow]:
    """The recent context-parallel steps; none for steps of another job."""
    return [CPStepRow.of(s.step, s.cp) for s in recent if s.cp is not None]


def build_frame(facts: JobFacts) -> Frame:
    if facts.window_s <= 0:
        msg = f"the rate window must be > 0 s, got {facts.window_s}"
        raise ValueError(msg)
    total_tokens = sum(s.tokens for s in facts.sources)
    total_scheduled = sum(s.scheduled_tokens for s in facts.sources)
    rows = [
        source_row(s, facts.window_s, total_tokens, total_scheduled, facts.schedule_now.get(s.name, 0.0))
        for s in facts.sources
    ]
    letters = [
        DeadLetterRow(t.source, r.reason[:REASON_WIDTH], r.letters)
        for t in tally(facts.dead_letters, {s.name: 0 for s in facts.sources})
        for r in t.shown()
    ]
    return Frame(
        job=facts.job,
        window_s=facts.window_s,
        sources=rows,
        constructor=constructor_row(facts),
        dead_letters=letters,
        dead_letters_total=sum(facts.dead_letters.values()),
        parts=part_rows(facts.recent),
        context_parallel=cp_rows(facts.recent),
    )


def _num(value: float | None, spec: str = ",.0f", unknown: str = "?") -> str:
    return unknown if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return _num(None if value is None else 100 * value, ".1f") + ("" if value is None else "%")


def render_frame(frame: Frame) -> Group:
    """The frame as rich tables: sources, the constructor, dead letters."""
    sources = Table(
        title=Text(f"job {frame.job}: sources (rates over the last {frame.window_s:g} s)"), title_justify="left"
    )
    for header in (
        "source",
        "samples/s",
        "tokens/s",
        "backlog",
        "loaders",
        "samples",
        "tokens",
        "share",
        "scheduled",
        "schedule now",
    ):
        sources.add_column(header, justify="left" if header == "source" else "right")
    for row in frame.sources:
        sources.add_row(
            Text(row.name),
            _num(row.samples_per_s, ",.1f"),
            _num(row.tokens_per_s),
            _num(row.backlog),
            _num(row.loaders, "d"),
            _num(row.samples, "d"),
            _num(row.tokens, "d"),
            _pct(row.share),
            _pct(row.scheduled_share),
            _pct(row.share_now),
        )
    c = frame.constructor
    constructor = Table(
        title=Text(f"constructor{' (finished)' if c.finished else ''}: the last {c.recent_steps} steps"),
        title_justify="left",
    )
    for header in ("steps written", "steps/s", "lead over trainer", "imbalance", "worst", "naive", "fill"):
        constructor.add_column(header, justify="right")
    constructor.add_row(
        _num(c.steps_written, "d"),
        _num(c.steps_per_s, ".2f"),
        _num(c.lead, "d", "unknown"),
        _num(c.imbalance_median, ".3f", "-"),
        _num(c.imbalance_max, ".3f", "-"),
        _num(c.naive_imbalance_median, ".3f", "-"),
        _pct(c.fill_mean) if c.fill_mean is not None else "-",
    )
    tables = [sources, constructor]
    if frame.parts:
        tables.append(render_parts(frame.parts, c.recent_steps))
    if frame.context_parallel:
        tables.append(render_context_parallel(frame.context_parallel))
    letters = Table(title=Text(f"dead letters: {frame.dead_letters_total}"), title_justify="left")
    for header in ("source", "reason", "records"):
        letters.add_column(header, justify="right" if header == "records" else "left")
    for letter in frame.dead_letters:
        letters.add_row(Text(letter.source), Text(letter.reason), str(letter.records))
    return Group(*tables, letters)


def render_parts(parts: Sequence[PartRow], steps: int) -> Table:
    """A multimodal job's balance by part of the rank cost: as written, at the bound (the least any plan of the
    step's samples could reach), and under naive per-rank loading."""
    table = Table(title=Text(f"rank cost by part: the last {steps} steps"), title_justify="left")
    for header in ("part", "imbalance", "worst", "bound", "bound worst", "naive"):
        table.add_column(header, justify="left" if header == "part" else "right")
    for row in parts:
        table.add_row(
            Text(row.part),
            _num(row.imbalance_median, ".3f"),
            _num(row.imbalance_max, ".3f"),
            _num(row.bound_median, ".3f"),
            _num(row.bound_max, ".3f"),
            _num(row.naive_imbalance_median, ".3f"),
        )
    return table


CP_STEPS_SHOWN = 8
"""The latest context-parallel steps shown, one row each."""


def render_context_parallel(rows: Sequence[CPStepRow]) -> Table:
    """A context-parallel job's latest steps: blocks, micro-batches a rank, and step time against the bound and
    static CP."""
    shown = list(rows)[-CP_STEPS_SHOWN:]
    table = Table(title=Text(f"context parallelism: the last {len(shown)} steps"), title_justify="left")
    for header in STEP_COLUMNS:
        table.add_column(header, justify="right" if header in ("step", "step time", "over the bound") else "left")
    for row in shown:
        table.add_row(*(Text(cell) for cell in row.cells()))
    return table
