"""What a constructor process has written: running totals over every step, and the last steps in detail.

A constructor of a ``next_epoch`` job runs for weeks; what it keeps per step must not grow with them. The
totals (steps, tokens, samples, ...) cover every step this process committed; per-step detail is kept
for the last ``recent_steps`` only (``DEFAULT_RECENT_STEPS`` by default; None keeps every step, for a
benchmark of a bounded run)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.planning.scheduler import CostModel
    from pipeline.planning.step.assemble import StepSummary

DEFAULT_RECENT_STEPS = 1024


@dataclass(frozen=True)
class StepRecord:
    step: int
    tokens: int
    samples: int
    deferred: int
    state_bytes: int
    max_rank_cost: float
    mean_rank_cost: float
    tokens_by_source: Mapping[str, int]
    packed: bool = False  # composition packed the holes and the scheduler started from its packing

    @classmethod
    def of(cls, step: StepSummary, cost_model: CostModel, state_bytes: int) -> StepRecord:
        """The record of a written ``step`` whose state record took ``state_bytes``."""
        costs = step.rank_costs(cost_model)
        return cls(
            step=step.step,
            tokens=step.tokens,
            samples=step.samples,
            deferred=step.deferred,
            state_bytes=state_bytes,
            max_rank_cost=float(costs.max()),
            mean_rank_cost=float(costs.mean()),
            tokens_by_source=dict(step.tokens_by_source),
            packed=step.started,
        )


@dataclass
class ConstructorStats:
    recent_steps: int | None = DEFAULT_RECENT_STEPS
    steps_written: int = 0
    first_step: int | None = None  # the first and last step this process committed (None: none yet)
    last_step: int | None = None
    tokens: int = 0
    samples: int = 0
    deferred: int = 0
    packed_steps: int = 0
    max_state_bytes: int = 0
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    recent: deque[StepRecord] = field(init=False)
    seconds: float = 0.0
    finished: bool = False
    takeovers: int = 0  # times this instance became the active one
    fenced: int = 0  # times a newer instance fenced it

    def __post_init__(self) -> None:
        if self.recent_steps is not None and self.recent_steps < 0:
            msg = f"recent_steps must be >= 0 or None, got {self.recent_steps}"
            raise ValueError(msg)
        self.recent = deque(maxlen=self.recent_steps)

    def add(self, record: StepRecord) -> None:
        """A committed step: into the totals, and into the recent steps (dropping the oldest beyond the limit)."""
        self.steps_written += 1
        if self.first_step is None:
            self.first_step = record.step
        self.last_step = record.step
        self.tokens += record.tokens
        self.samples += record.samples
        self.deferred += record.deferred
        self.packed_steps += int(record.packed)
        self.max_state_bytes = max(self.max_state_bytes, record.state_bytes)
        for source, tokens in record.tokens_by_source.items():
            self.tokens_by_source[source] = self.tokens_by_source.get(source, 0) + tokens
        self.recent.append(record)
