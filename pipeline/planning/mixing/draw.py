"""Drawing one step: how many samples each source gives, so that token shares follow the weights.

Per step, every source ``s`` gets a target of ``w'[s] * X + credit[s]`` tokens, where ``w'`` are the
weights over the sources still in play and ``X`` the budget less what exhausted sources gave (see
below), so the targets sum to the budget. Its deferred samples (drawn before, not placed by the
scheduler) come first and count toward it; then samples are taken from the head of its FIFO while the
target is not met. The last sample may overshoot; the credit carries the difference to later steps,
so each source's cumulative share of *delivered* tokens stays within about one sample of the schedule.
A source with weight 0 at this step gives only its deferred samples and its credit is dropped (shared
out among the others), so a finished curriculum phase never stalls a step.

A source whose FIFO cannot meet its target makes the draw wait for it (``DrawStatus.WAITING``),
unless it is exhausted (no more samples will come): then ``on_exhausted`` applies — ``stop`` ends the
job (``DrawStatus.STOP``), ``renormalize`` takes all it has and gives the rest of its share to the
others by weight (repeated until no further source falls short), and ``next_epoch`` waits, as the
loaders start another pass. The draw uses no randomness: the same state and FIFO heads give the same
draw.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike

from pipeline.planning.mixing._take import EMPTY, Take, take, take_all
from pipeline.planning.mixing.state import MixerState
from pipeline.spec.sections import OnExhausted

NO_LONG = np.iinfo(np.int64).max


class DrawStatus(StrEnum):
    OK = "ok"
    WAITING = "waiting"
    """Some sources need more samples first (``Draw.waiting_for``); call again when they have them."""
    STOP = "stop"
    """An exhausted source cannot fill its share and ``on_exhausted`` is ``stop`` (``Draw.exhausted``)."""


@dataclass(frozen=True)
class LongContext:
    """Reserve ``token_share`` of each step's tokens for samples of at least ``min_length`` tokens,
    drawn from ``sources`` (those whose samples can be that long) in proportion to their weights."""

    min_length: int
    token_share: float
    sources: frozenset[str]


@dataclass(frozen=True)
class Draw:
    """The result of ``draw_step``. Per source: ``take`` the positions drawn from its FIFO (without
    long context always ``0..n-1``); ``lengths`` the lengths of the step's samples, its deferred
    samples first and then the drawn ones; ``long`` which of those are long-context samples."""

    step: int
    status: DrawStatus
    waiting_for: tuple[str, ...] = ()
    exhausted: tuple[str, ...] = ()
    take: dict[str, np.ndarray] = field(default_factory=dict)
    lengths: dict[str, np.ndarray] = field(default_factory=dict)
    long: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    """The weights used: the schedule's, renormalised over the sources still in play."""
    targets: dict[str, float] = field(default_factory=dict)
    state_before: MixerState = field(default_factory=MixerState)
    min_length: int = NO_LONG
    long_share: float = 0.0
    budget_tokens: int = 0
    placement: dict[str, np.ndarray] | None = None
    """Where composition packed the step (``compose_step``), else None: per source, the micro-batch
    (``rank * micro_batches + m``, -1 for none) of each of ``lengths``."""

    @property
    def tokens(self) -> dict[str, int]:
        return {s: int(v.sum()) for s, v in self.lengths.items()}

    def start_for(self, sources: Sequence[str]) -> np.ndarray | None:
        """``placement`` as the scheduler's ``start`` for the step's samples in the order the pool hands them
        over (``sources``: each one's source), or None without a placement. Each source's samples keep
        ``lengths``' order within that list, wherever the others fall between them."""
        if self.placement is None:
            return None
        codes = np.fromiter(map({s: k for k, s in enumerate(self.placement)}.__getitem__, sources), np.int64)
        start = np.empty(len(codes), np.int64)
        for k, slots in enumerate(self.placement.values()):
            mine = np.flatnonzero(codes == k)
            if len(mine) != len(slots):
                msg = f"{len(mine)} samples of {list(self.placement)[k]!r} for a placement of {len(slots)}"
                raise ValueError(msg)
            start[mine] = slots
        return start

    @property
    def state(self) -> MixerState:
        """The state after this step if every drawn sample is delivered; ``settle`` otherwise."""
        return self.settle()

    def settle(self, deferred: Mapping[str, ArrayLike] | None = None) -> MixerState:
        """The state after this step when the samples ``deferred`` (lengths per source) were drawn but
        not placed: they are not delivered now, and come back as the next draw's ``deferred``."""
        if self.status is not DrawStatus.OK:
            return self.state_before
        back = _lengths_by_source(deferred or {}, self.lengths, "deferred")
        delivered = {s: float(v.sum() - back[s].sum()) for s, v in self.lengths.items()}
        long_back = sum(float(v[v >= self.min_length].sum()) for v in back.values())
        for s, tokens in delivered.items():
            if tokens < 0:
                msg = f"deferred[{s!r}] holds more tokens than source {s!r} gave to step {self.step}"
                raise ValueError(msg)
        credit = _settle_credit(self.state_before.credit, self.weights, delivered)
        long_credit = 0.0
        if self.long_share > 0:
            long_delivered = sum(float(v[v >= self.min_length].sum()) for v in self.lengths.values()) - long_back
            long_credit = self.state_before.long_credit + self.long_share * sum(delivered.values()) - long_delivered
            long_credit = max(long_credit, -float(self.budget_tokens))  # long samples above the share are not owed back
        return MixerState(step=self.step + 1, credit=credit, long_credit=long_credit)


def _settle_credit(
    credit: Mapping[str, float], weights: Mapping[str, float], delivered: Mapping[str, float]
) -> dict[str, float]:
    """Each source in play is credited its weight's share of what the sources in play delivered (plus
    the credits dropped by the sources out of play), less what it delivered; the others drop to 0."""
    in_play = [s for s, w in weights.items() if w > 0]
    dropped = sum(credit.get(s, 0.0) for s in weights if s not in in_play)
    pool = sum(delivered[s] for s in in_play) + dropped
    out = dict.fromkeys(weights, 0.0)
    for s in in_play:
        out[s] = credit.get(s, 0.0) + weights[s] * pool - delivered[s]
    return out


def _lengths_by_source(given: Mapping[str, ArrayLike], sources: Collection[str], what: str) -> dict[str, np.ndarray]:
    unknown = sorted(set(given) - set(sources))
    if unknown:
        msg = f"{what} names sources that are not mixed: {unknown}"
        raise ValueError(msg)
    out = {}
    for s in sources:
        lengths = np.asarray(given.get(s, EMPTY), dtype=np.int64).reshape(-1)
        if len(lengths) and lengths.min() <= 0:
            msg = f"{what}[{s!r}] holds a sample length <= 0: {int(lengths.min())}"
            raise ValueError(msg)
        out[s] = lengths
    return out


def draw_step(
    state: MixerState,
    weights: Mapping[str, float],
    budget_tokens: int,
    available: Mapping[str, ArrayLike],
    deferred: Mapping[str, ArrayLike] | None = None,
    *,
    exhausted: Collection[str] = (),
    on_exhausted: OnExhausted = OnExhausted.STOP,
    long_context: LongContext | None = None,
) -> Draw:
    """Draw step ``state.step``: see the module docstring.

    ``weights``: each source's share at this step (the schedule's; every mixed source appears, in a
    fixed order). ``available``: per source, the lengths of its buffered samples in FIFO order.
    ``deferred``: per source, the lengths of samples drawn before and deferred by the scheduler; they
    are always all drawn. ``exhausted``: sources whose FIFO will get no more samples.
    """
    if budget_tokens <= 0:
        msg = f"budget_tokens must be > 0, got {budget_tokens}"
        raise ValueError(msg)
    w = np.asarray([float(weights[s]) for s in weights], dtype=np.float64)  # (S,)
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        msg = f"weights must be finite, >= 0 and sum to more than 0, got {dict(weights)}"
        raise ValueError(msg)
    sources = list(weights)
    avail = _lengths_by_source(available, sources, "available")
    before = _lengths_by_source(deferred or {}, sources, "deferred")
    unknown = sorted(set(exhausted) - set(sources))
    if unknown:
        msg = f"exhausted names sources that are not mixed: {unknown}"
        raise ValueError(msg)
    final = set(exhausted) if on_exhausted is not OnExhausted.NEXT_EPOCH else set()
    planner = _Planner(
        state, dict(zip(sources, w / w.sum(), strict=True)), budget_tokens, avail, before, final, long_context
    )
    return planner.run(on_exhausted)


class _Planner:
    """The fixed-point loop of one draw: sources found short and exhausted leave play (renormalize)
    until no further source falls short."""

    def __init__(
        self,
        state: MixerState,
        weights: dict[str, float],
        budget: int,
        avail: dict[str, np.ndarray],
        before: dict[str, np.ndarray],
        final: set[str],
        long_context: LongContext | None,
    ) -> None:
        self.state, self.weights, self.budget = state, weights, budget
        self.avail, self.before, self.final, self.long_context = avail, before, final, long_context
        self.min_length = long_context.min_length if long_context else NO_LONG
        self.out: set[str] = {s for s, x in weights.items() if x <= 0}  # out of play this step
        self.given_up: dict[str, Take] = {}  # exhausted and short: all they have

    def run(self, on_exhausted: OnExhausted) -> Draw:
        while True:
            in_play = [s for s in self.weights if s not in self.out]
            if not in_play:
                return self._result(DrawStatus.STOP, exhausted=tuple(self.given_up))
            eff = self._effective_weights(in_play)
            targets = self._targets(eff)
            long_targets = self._long_targets(eff, targets)
            takes, waiting, short_final = {}, [], []
            for s in in_play:
                got = self._take(s, targets[s], long_targets.get(s, 0.0))
                if got is not None:
                    takes[s] = got
                elif s in self.final:
                    short_final.append(s)
                else:
                    waiting.append(s)
            if short_final and on_exhausted is OnExhausted.STOP:
                return self._result(DrawStatus.STOP, exhausted=tuple(short_final))
            if short_final:  # renormalize: they give all they have and leave play; targets rise, retry
                for s in short_final:
                    self.given_up[s] = take_all(self.avail[s], self.min_length)
                    self.out.add(s)
                continue
            if waiting:
                return self._result(DrawStatus.WAITING, waiting_for=tuple(waiting))
            for s in self.out:
                takes[s] = self.given_up.get(s) or Take(EMPTY, 0, 0)
            return self._result(DrawStatus.OK, exhausted=tuple(self.given_up), takes=takes, eff=eff, targets=targets)

    def _effective_weights(self, in_play: list[str]) -> dict[str, float]:
        total = sum(self.weights[s] for s in in_play)
        return {s: (self.weights[s] / total if s in in_play else 0.0) for s in self.weights}

    def _targets(self, eff: dict[str, float]) -> dict[str, float]:
        credit = self.state.credit
        given = sum(t.tokens + int(self.before[s].sum()) for s, t in self.given_up.items())
        dropped = sum(credit.get(s, 0.0) for s in self.out)
        pool = self.budget - given + dropped
        return {s: x * pool + credit.get(s, 0.0) for s, x in eff.items() if x > 0}

    def _long_targets(self, eff: dict[str, float], targets: dict[str, float]) -> dict[str, float]:
        lc = self.long_context
        if lc is None:
            return {}
        capable = [s for s in targets if s in lc.sources]
        held = sum(eff[s] for s in capable)
        wanted = lc.token_share * self.budget + self.state.long_credit
        if held <= 0 or wanted <= 0:
            return {}
        return {s: min(wanted * eff[s] / held, max(targets[s], 0.0)) for s in capable}

    def _take(self, s: str, target: float, long_target: float) -> Take | None:
        before = self.before[s]
        need = target - float(before.sum())
        need_long = long_target - float(before[before >= self.min_length].sum())
        return take(self.avail[s], need, need_long, self.min_length, s in self.final)

    def _result(
        self,
        status: DrawStatus,
        *,
        waiting_for: tuple[str, ...] = (),
        exhausted: tuple[str, ...] = (),
        takes: dict[str, Take] | None = None,
        eff: dict[str, float] | None = None,
        targets: dict[str, float] | None = None,
    ) -> Draw:
        step = self.state.step
        if takes is None:
            return Draw(step, status, waiting_for, exhausted, state_before=self.state)
        order = list(self.weights)
        positions = {s: takes[s].positions for s in order}
        lengths = {s: np.concatenate([self.before[s], self.avail[s][positions[s]]]) for s in order}
        return Draw(
            step,
            status,
            waiting_for,
            exhausted,
            take=positions,
            lengths=lengths,
            long={s: v >= self.min_length for s, v in lengths.items()},
            weights=eff or {},
            targets=targets or {},
            state_before=self.state,
            min_length=self.min_length,
            long_share=self.long_context.token_share if self.long_context else 0.0,
            budget_tokens=self.budget,
        )
