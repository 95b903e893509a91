"""The active constructor's step loop, from the last committed state: the Kafka side of each step (reading
the sources, waiting for them or for the trainers, taking in mixture changes, handing steps to the writer)
around the step core (``pipeline.planning.step.core``), which draws and plans."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from pipeline.planning.mixing import DrawStatus, Mixer, MixerState
from pipeline.planning.step.assemble import AssembledStep, BatchFormat, StepSummary, assemble_planned
from pipeline.planning.step.core import PlannedStep, StepCore, StepOutcome
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.state import ConstructorState, SourcePosition
from pipeline.roles.constructor.control_intake import ControlIntake
from pipeline.roles.constructor.lead import TrainerPacing
from pipeline.roles.constructor.metrics import ConstructorMetrics
from pipeline.roles.constructor.sources import SourceTopicFeed
from pipeline.roles.constructor.step_records import StepRecords
from pipeline.roles.constructor.writer import PreparedStep, StepWriter
from pipeline.spec import JobSpec, OnExhausted

log = logging.getLogger(__name__)


class LoopHost(Protocol):
    """What the step loop asks of the role that runs it."""

    def running(self) -> bool:
        """Not stopping, and still holding the lease."""
        ...

    def at_max_steps(self, in_flight: int) -> bool:
        """Whether the steps committed and the ``in_flight`` ones reach ``max_steps``."""
        ...

    def end_at_max_steps(self) -> None: ...

    def step_done(self, step: StepSummary, state_bytes: int) -> None:
        """A step committed (on the main thread)."""
        ...

    def job_finished(self) -> None: ...


@dataclass
class StepLoop:
    """One attempt of the active constructor: its clients and the pool, from the last committed state."""

    host: LoopHost
    spec: JobSpec
    mixer: Mixer
    core: StepCore
    pool: SamplePool
    feed: SourceTopicFeed
    writer: StepWriter
    records: StepRecords
    control: ControlIntake
    pacing: TrainerPacing
    metrics: ConstructorMetrics
    dormant: dict[str, SourcePosition]  # sources the spec no longer mixes, kept where they were
    lag_log_interval_s: float = 10.0
    _last_lag_log: float = field(default_factory=time.monotonic)

    @cached_property
    def batch_format(self) -> BatchFormat:
        return BatchFormat.of(self.spec)

    def run(self, state: ConstructorState) -> None:
        """Steps from ``state`` on, until the job is finished, this instance stops or loses the lease, or a
        transaction aborts (the caller then resumes from the last committed state)."""
        mixer_state, exhausted = state.mixer, set(state.exhausted)
        if not self._read_to_end(exhausted):
            return
        while self.host.running():
            if not self.writer.poll():  # the step in flight was aborted: what is prepared since is dropped
                log.warning("the step in flight was aborted; resuming from the last committed step")
                return
            self.metrics.look_at_pool(self.pool)
            if self.host.at_max_steps(self.writer.in_flight):
                self._end_at_max_steps()
                return
            if (held_back_for := self._held_back(mixer_state.step)) is not None:
                if not self._flush():  # what is prepared goes out while this one waits
                    return
                if held_back_for:
                    self.feed.fill(held_back_for)
                continue
            after = self._step(mixer_state, exhausted)
            if after is None:
                return
            mixer_state = after

    def _step(self, state: MixerState, exhausted: set[str]) -> MixerState | None:
        """Draw step ``state.step`` and hand it to the writer, or wait for the sources it needs: the mixer's
        state to go on from; None when the loop ends (the job finished, or a transaction aborted)."""
        outcome = self._next_step(state, exhausted)
        if outcome.planned is not None:
            return outcome.planned.next_state if self._write_planned(outcome.planned, exhausted) else None
        if outcome.status is DrawStatus.WAITING:
            return state if self._wait_for(outcome.waiting_for, state.step, exhausted) else None
        # STOP: an exhausted source cannot fill its share (stop), or every source ran out.
        self._finish(state, exhausted)
        return None

    def _finish(self, mixer_state: MixerState, exhausted: set[str]) -> None:
        """End the job. Unless the policy is ``stop``, and once every source has run out, what is left goes out
        in final steps, so every sample of finite sources is delivered exactly once."""
        pool, feed = self.pool, self.feed
        all_out = set(exhausted) >= set(pool.sources) or all(feed.is_exhausted(s) for s in pool.sources)
        if self.spec.on_exhausted is not OnExhausted.STOP and all_out:
            if not self._read_to_end(pool.sources):
                return
            while not pool.empty():
                if self.host.at_max_steps(self.writer.in_flight):
                    self._end_at_max_steps()
                    return
                while not self.pacing.allows(mixer_state.step):
                    if not self.host.running() or not self._flush():
                        return
                planned = self.core.final_step(mixer_state, pool.window())
                if not self._write_planned(planned, exhausted):
                    return
                mixer_state = planned.next_state
        last = mixer_state.step - self.core.lanes
        if self._write(mixer_state, exhausted, finished=True) and self.writer.wait():
            self.host.job_finished()
            log.info("job %s finished after step %d", self.records.out.job, last)

    def _held_back(self, step: int) -> Collection[str] | None:
        """None when ``step`` may be drawn now; otherwise the sources to read meanwhile: none while the
        trainers are too far behind, those whose checkpointed deferred samples are not read again yet."""
        if not self.pacing.allows(step):
            return ()
        return self.pool.waiting_for_deferred() or None

    def _next_step(self, state: MixerState, exhausted: Collection[str]) -> StepOutcome:
        self.control.read(state.step, self.core.lanes, self.spec.source_names)
        mixer = self.control.mixer(self.mixer)
        c = mixer.composition
        if c is not None:
            self.feed.hold(c.window + 2, mixer.weights_at(state.step), c.window_bytes)
        window = self.pool.window(with_sizes=c is not None and c.window_bytes is not None)
        return self.core.next_step(mixer, state, window, exhausted)

    def _wait_for(self, sources: tuple[str, ...], step: int, exhausted: set[str]) -> bool:
        """Read more of ``sources``, which the draw of ``step`` waits for; a source that ran out joins
        ``exhausted``, or with ``next_epoch`` starts another pass. False when a transaction aborted."""
        if not self._flush():  # steps of a group not yet full go out while this one waits
            return False
        if self.spec.on_exhausted is OnExhausted.NEXT_EPOCH:
            # A source that ran out starts another pass: its loaders plan the next epoch.
            for s in sources:
                if self.feed.is_exhausted(s):
                    self.feed.ask_for_next_epoch(s, self.spec.source(s).epochs)
        elif newly := {s for s in sources if s not in exhausted and self.feed.is_exhausted(s)}:
            exhausted |= newly
            log.info("sources ran out: %s", ", ".join(sorted(newly)))
            return True
        self.feed.fill(sources)
        if time.monotonic() - self._last_lag_log > self.lag_log_interval_s:
            for s in sources:
                log.info("step %d waits for source %s: %s", step, s, self.feed.lag(s))
            self._last_lag_log = time.monotonic()
        return True

    def _read_to_end(self, sources: Iterable[str]) -> bool:
        """Read ``sources``, which ran out, to their ends; False when stopped or the lease is lost first.

        A source that ran out is drawn from as a whole (all that is left of it), and its leftovers go out in
        the final steps. A constructor resuming after it ran out has not read again what lies past its low
        watermark: without this it would draw from part of it (steps differing from an uninterrupted run's)
        or end the job without the rest."""
        while behind := sorted(s for s in sources if not self.feed.is_exhausted(s)):
            if not self.host.running():
                return False
            self.feed.fill(behind)
        return True

    def _end_at_max_steps(self) -> None:
        """Write what is handed over and stop; an aborted last step is redone (from the last committed one)
        before stopping."""
        if self.writer.wait():
            self.host.end_at_max_steps()
        else:
            log.warning("the last step was aborted; resuming from the last committed step")

    def _flush(self) -> bool:
        """Write the steps handed over while this one waits; False (logged) when a transaction aborted."""
        if self.writer.flush():
            return True
        log.warning("a transaction of steps was aborted; resuming from the last committed step")
        return False

    # -- handing steps to the writer --------------------------------------------------------------

    def _write_planned(self, planned: PlannedStep, exhausted: Collection[str]) -> bool:
        """Take the ``planned`` step's samples from the pool, build and encode its batches and hand it to the
        writer. The samples are let go once encoded, before this waits for the transaction in flight."""
        prepared = self._prepare(self._assembled(planned), planned.next_state, exhausted)
        return self._hand_over(prepared, planned.next_state)

    def _assembled(self, planned: PlannedStep) -> AssembledStep:
        assembled = assemble_planned(planned, self.pool.take(planned.taken, planned.order), self.batch_format)
        self.pool.settle(assembled.delivered, assembled.deferred)
        return assembled

    def _write(self, mixer: MixerState, exhausted: Collection[str], finished: bool) -> bool:
        """Hand the state alone (no step) to the writer."""
        return self._hand_over(self._prepare(None, mixer, exhausted, finished), mixer)

    def _prepare(
        self, assembled: AssembledStep | None, mixer: MixerState, exhausted: Collection[str], finished: bool = False
    ) -> PreparedStep:
        """One step's transaction (or, with ``assembled`` None, only the final state's), encoded."""
        control = self.control
        state = ConstructorState(
            mixer,
            {**self.pool.positions(), **self.dormant},
            self.pool.deferred_refs(),
            tuple(sorted(exhausted)),
            finished,
            control.changes,
            control.offset,
            control.refused,
        )
        letters = list(self.feed.dead_letters)
        self.feed.dead_letters.clear()  # an aborted step makes the next attempt read them again

        def done(step: StepSummary | None, state_bytes: int) -> None:
            if step is not None:
                self.host.step_done(step, state_bytes)

        def committed(step: StepSummary | None) -> None:  # on the writer thread at once: no wait for the next step
            self.metrics.step_committed(step, letters)

        return self.records.prepare(assembled, state, letters, done, committed)

    def _hand_over(self, prepared: PreparedStep, mixer: MixerState) -> bool:
        """Hand a prepared step to the writer, whose thread writes it while this one prepares the next. False
        when the step before it was aborted: this one is dropped, and the caller resumes from the last
        committed state."""
        if not self.writer.write(prepared):
            written = mixer.step - self.core.lanes
            log.warning("a step up to step %d was aborted; resuming from the last committed step", written)
            return False
        return True
