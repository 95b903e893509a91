"""The data constructor role: mix the source topics by the spec, balance each step, write one batch per
rank per step, exactly once.

Each step is one Kafka transaction holding the batch of every rank (``<job>.rank.<r>``), the step's
state record (``<job>.state``) and the source offsets (``send_offsets_to_transaction``). The state
record is the checkpoint: a restarted constructor reads the last committed one, re-reads each source
from its low watermark and continues with the next step, writing exactly what an uninterrupted run
would have written. Its ``transactional.id`` is stable per job, so a restart fences a zombie.

Several instances of a job's constructor may run: one is active, the others are shadows that wait,
ready, for the lease (``lease.py``) and take over from the last committed step when the active one
dies. Mixture changes published on ``<job>.control`` are read before each step (``pipeline.kafka.control``).

With ``constructor.lanes`` C above 1, lane ``j`` (``ConstructorOptions.lane``) builds the steps ``k`` with
``k mod C == j`` from partition ``j`` of every source topic, into partition ``j`` of every rank topic and
of the state topic, with a state record, ``transactional.id``, offsets group and lease of its own. The
mixer's step is the global step ``k``: schedules, random choices and mixture changes follow it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
from confluent_kafka import KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from pipeline.kafka.clients import KafkaConfig, ProducerFencedError, read_committed_settings
from pipeline.kafka.control import ControlReader
from pipeline.kafka.role_protocol import TransactionalRole, closing_unless_stuck
from pipeline.kafka.state_topic import read_last_state, written_shape
from pipeline.planning.mixing import DrawStatus, Mixer, MixerState, MixtureChange, refusal
from pipeline.planning.scheduler import plan_step
from pipeline.planning.step.assemble import AssembledStep, assemble_step
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.spec_change import StepShape, carry_over, check_step_shape
from pipeline.planning.step.state import MAX_REFUSED, ConstructorState, SourcePosition
from pipeline.roles.constructor.lead import ProgressReader, lead_allows, slowest_rank
from pipeline.roles.constructor.lease import DEFAULT_SESSION_TIMEOUT_MS, ConstructorLease
from pipeline.roles.constructor.metrics import ConstructorMetrics
from pipeline.roles.constructor.sources import SourceTopicFeed
from pipeline.roles.constructor.stats import DEFAULT_RECENT_STEPS, ConstructorStats, StepRecord
from pipeline.roles.constructor.writer import PreparedStep, Record, StepWriter
from pipeline.spec import JobSpec, OnExhausted
from topics.admin import ensure_job_topics
from topics.batch_codec import batch_key, encode_batch, encode_end_of_data
from topics.dead_letter import encode_dead_letter
from topics.errors import MixflowError
from topics.names import JobTopics
from topics.renewing_consumer import RenewingConsumer
from topics.retry import KafkaUnavailableError

log = logging.getLogger(__name__)

SHADOW_LOOK_S = 10.0
"""How long a shadow's look at the job's state may take (it looks every 2 s)."""


@dataclass(frozen=True)
class ConstructorOptions:
    # Write rank and state topics under another job name while reading this job's sources, e.g. to
    # replay a job's data with another mixture, or to check determinism.
    output_job: str | None = None
    max_steps: int | None = None
    transaction_timeout_ms: int = 60_000
    lag_log_interval_s: float = 10.0
    # The state to start from when the output job has no state yet (replay from a step of another job).
    start_state: ConstructorState | None = None
    # Mixture changes to apply instead of reading the control topic (a replay applies the original's).
    replay_changes: tuple[MixtureChange, ...] | None = None
    lease_session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    instance: str = ""
    lane: int = 0  # which of the spec's constructor lanes this instance builds
    recent_steps: int | None = DEFAULT_RECENT_STEPS  # steps kept in detail in stats.recent (None: every one)


class DataConstructor(TransactionalRole):
    kind = "constructor"
    work_unit = "step"

    def __init__(
        self,
        spec: JobSpec,
        config: KafkaConfig,
        options: ConstructorOptions = ConstructorOptions(),
        metrics: ConstructorMetrics | None = None,
    ) -> None:
        super().__init__(config, options.transaction_timeout_ms)
        self.spec = spec
        self.options = options
        self.sources_topics = JobTopics(spec.job)
        self.out = JobTopics(options.output_job or spec.job)
        self.lanes = spec.constructor.lanes
        self.lane = options.lane
        if not 0 <= self.lane < self.lanes:
            msg = f"constructor lane {self.lane} is not below the spec's constructor.lanes ({self.lanes})"
            raise MixflowError(msg)
        if self.lanes > 1 and options.start_state is not None:
            msg = f"a replay from a start state is not supported with constructor.lanes {self.lanes} (only 1)"
            raise MixflowError(msg)
        self.mixer = Mixer.from_spec(spec)
        self.cost_model = spec.cost.cost_model()
        self.stats = ConstructorStats(options.recent_steps)
        self.metrics = metrics or ConstructorMetrics(CollectorRegistry(), self.out.job, spec)
        self._dormant: dict[str, SourcePosition] = {}  # sources the spec no longer mixes, kept where they were
        self.instance = options.instance or f"{socket.gethostname()}-{os.getpid()}"
        self._lease: ConstructorLease | None = None
        self._control: ControlReader | None = None
        self._progress: ProgressReader | None = None  # with max_lead_steps: the trainers' reports
        self._last_lead_log = 0.0
        # The control part of the state record being built: accepted changes, next offset, refused ids.
        self._changes: tuple[MixtureChange, ...] = ()
        self._control_offset = 0
        self._refused: tuple[str, ...] = ()

    @property
    def transactional_id(self) -> str:
        """Also the group of its source offsets: one per lane (a job without lanes keeps the plain name)."""
        return f"{self.out.job}.constructor" + (f".lane{self.lane}" if self.lanes > 1 else "")

    def run(self) -> ConstructorStats:
        """Construct until the job is finished, ``max_steps`` are written or a signal stops it: as the
        active instance while this one holds the lease, as a shadow while another does."""
        self.stop_on_signals()
        shape = self.spec.step
        check_step_shape(
            written_shape(self.config, self.out, self.lane),
            StepShape(shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch),
            self.out.job,
        )
        names, ranks = self.spec.source_names, self.spec.step.ranks
        ensure_job_topics(self.config, self.sources_topics.job, names, ranks, lanes=self.lanes)
        if self.out.job != self.sources_topics.job:
            ensure_job_topics(self.config, self.out.job, names, ranks, lanes=self.lanes)
        self._warm_up()
        began = time.monotonic()
        self._lease = ConstructorLease(
            self.config,
            self.out,
            self.instance,
            self.options.lease_session_timeout_ms,
            group=f"{self.transactional_id}.lease",
        )
        try:
            while not self.stopping and not self.stats.finished:
                if not self._wait_as_shadow():
                    break
                self.stats.takeovers += 1
                self.metrics.became_active()
                self._run_while_active()
                self.metrics.became_shadow()
        finally:
            self.stats.seconds = time.monotonic() - began
            self._lease.close()
        return self.stats

    def _warm_up(self) -> None:
        """Load the scheduler's compiled kernels now, not in the first step after a takeover."""
        shape = self.spec.step
        lengths = np.ones(2, dtype=np.int64)
        plan_step(lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, self.cost_model)

    def _wait_as_shadow(self) -> bool:
        """Follow the job as a shadow until this instance holds the lease (True), or until the job is
        finished or a signal stops it (False)."""
        assert self._lease is not None
        if self._lease.wait_for_first_assignment(timeout_s=10.0):
            return True
        log.info("constructor %s of %s: shadow, waiting for the lease", self.instance, self.out.job)
        last_look = last_member_look = 0.0
        seen_step, seen_at = -1, time.monotonic()
        outside_since: float | None = None
        # A lease consumer can miss its way back into the group after a broker restart: when the job has
        # not moved for this long, or the brokers have not counted this instance a member for this long,
        # join again as a new member (harmless if an active one merely waits).
        stalled_s = max(15.0, 10 * self.options.lease_session_timeout_ms / 1000)
        while not self.stopping:
            if self._lease.poll(0.2):
                return True
            if time.monotonic() - last_member_look > stalled_s / 3:
                last_member_look = now = time.monotonic()
                outside_since = None if self._lease.in_group() else (outside_since or now)
                if outside_since is not None and now - outside_since > stalled_s:
                    log.info("shadow %s: not in the lease group for %.0f s; joining again", self.instance, stalled_s)
                    self._lease.rejoin()
                    outside_since = None
            if time.monotonic() - last_look > 2.0:
                last_look = time.monotonic()
                try:
                    # A short look: a client left stuck by a broker restart is dropped for a new one at the
                    # next look (with the default minute one stuck shadow took 51 s over in a chaos run).
                    state = self._last_state(SHADOW_LOOK_S)
                except (KafkaException, KafkaUnavailableError, TimeoutError) as exc:
                    log.info("shadow %s: cannot read the job's state now (%s); waiting", self.instance, exc)
                    continue
                if state.finished:
                    log.info("job %s finished at step %d (followed as a shadow)", self.out.job, state.step)
                    self.stats.finished = True
                    return False
                if state.step != seen_step:
                    seen_step, seen_at = state.step, time.monotonic()
                elif time.monotonic() - seen_at > stalled_s:
                    log.info("shadow %s: no step for %.0f s; joining the lease group again", self.instance, stalled_s)
                    self._lease.rejoin()
                    seen_at = time.monotonic()
                log.debug("shadow %s: the active constructor is at step %d", self.instance, state.step)
        return False

    def _run_while_active(self) -> None:
        assert self._lease is not None
        producer = self.new_producer()  # fences the instance that was active before
        try:
            while not self.stopping and not self.stats.finished and self._lease.held:
                self._run_from_checkpoint(producer)
        except ProducerFencedError as exc:
            self.stats.fenced += 1
            self.metrics.fenced.inc()
            log.warning("constructor %s: %s; following as a shadow again", self.instance, exc)
            self._lease.rejoin()
            return
        producer.flush(30)

    # -- one attempt: from the last committed state until done, stopped or aborted ----------------

    def _run_from_checkpoint(self, producer: Producer) -> None:
        carried = carry_over(self._last_state(), self.spec.source_names)
        if carried.added or carried.removed:
            log.info(
                "constructor %s: from step %d the spec adds sources %s and removes %s (kept at their positions)",
                self.transactional_id,
                carried.state.step,
                list(carried.added),
                list(carried.removed),
            )
        state, self._dormant = carried.state, carried.dormant
        self._changes, self._control_offset, self._refused = state.changes, state.control_offset, state.refused
        if self.options.replay_changes is not None:
            self._changes = tuple(self.options.replay_changes)
        if state.finished:
            log.info("job %s finished at step %d already", self.out.job, state.step)
            self.stats.finished = True
            return
        log.info("constructor %s: resuming at step %d", self.transactional_id, state.step)
        pool = SamplePool(state)
        consumer = RenewingConsumer(
            read_committed_settings(
                self.config,
                self.transactional_id,
                **{"enable.partition.eof": True},  # tells when a source has been read to its end
            )
        )
        budget = self.mixer.budget_tokens
        feed = SourceTopicFeed(consumer, self.config, self.sources_topics, pool, budget, self.lane)
        closes = [feed.close, consumer.close]
        self._control = None
        if self.options.replay_changes is None:
            self._control = ControlReader(self.config, self.out, self._control_offset)
            closes.append(self._control.close)
        per_transaction = self.spec.constructor.transaction_steps(self.spec.step.ranks)
        self._progress = None
        if self.spec.constructor.max_lead_steps is not None:
            self._progress = ProgressReader(self.config, self.out.job)
            closes.append(self._progress.close)
        writer = StepWriter(self, producer, consumer, self.metrics.transaction_ended, per_transaction)
        closes.insert(0, writer.close)
        with closing_unless_stuck(*closes):
            try:
                self._steps(writer, feed, pool, state)
            finally:
                if not writer.wait():
                    log.warning("the last step in flight was aborted; a restart resumes before it")

    def _steps(self, writer: StepWriter, feed: SourceTopicFeed, pool: SamplePool, state: ConstructorState) -> None:
        mixer_state, exhausted = state.mixer, set(state.exhausted)
        last_lag_log = time.monotonic()
        assert self._lease is not None
        if not self._read_to_end(feed, exhausted):
            return
        while not self.stopping and self._lease.poll():
            if not writer.poll():  # the step in flight was aborted: what is prepared since is dropped
                log.warning("the step in flight was aborted; resuming from the last committed step")
                return
            self.metrics.look_at_pool(pool)
            written = self.stats.steps_written + writer.in_flight
            if self.options.max_steps is not None and written >= self.options.max_steps:
                if not writer.wait():  # the last step aborted: redo it before stopping
                    log.warning("the last step was aborted; resuming from the last committed step")
                    return
                self._stopping = True
                return
            if not self._trainers_allow(mixer_state.step):
                if not self._flush(writer):  # what is prepared goes out while the trainers catch up
                    return
                continue
            if waiting := pool.waiting_for_deferred():
                if not self._flush(writer):
                    return
                feed.fill(waiting)
                continue
            self._read_control(mixer_state.step)
            mixer = self.mixer.with_changes(self._changes)
            if mixer.composition is not None:
                feed.hold(mixer.composition.window + 2, mixer.weights_at(mixer_state.step))
            draw = mixer.draw(mixer_state, pool.available_lengths(), pool.deferred_lengths(), exhausted)
            if draw.status is DrawStatus.OK:
                candidates = pool.take(draw.take)
                # Each candidate's source is looked up only for a draw that comes with a placement.
                start = None if draw.placement is None else draw.start_for([c.ref.source for c in candidates])
                assembled = assemble_step(mixer_state.step, candidates, self.spec.step, self.cost_model, start)
                pool.settle(assembled.delivered, assembled.deferred)
                next_mixer = self._lane_step(draw.settle(pool.deferred_lengths()))
                if not self._write(writer, feed, pool, assembled, next_mixer, exhausted, False):
                    return
                mixer_state = next_mixer
                continue
            if draw.status is DrawStatus.WAITING:
                if not self._flush(writer):  # steps of a group not yet full go out while this one waits
                    return
                if self.spec.on_exhausted is OnExhausted.NEXT_EPOCH:
                    # A source that ran out starts another pass: its loaders plan the next epoch.
                    for s in draw.waiting_for:
                        if feed.is_exhausted(s):
                            feed.ask_for_next_epoch(s, self.spec.source(s).epochs)
                elif newly := {s for s in draw.waiting_for if s not in exhausted and feed.is_exhausted(s)}:
                    exhausted |= newly
                    log.info("sources ran out: %s", ", ".join(sorted(newly)))
                    continue
                feed.fill(draw.waiting_for)
                if time.monotonic() - last_lag_log > self.options.lag_log_interval_s:
                    for s in draw.waiting_for:
                        log.info("step %d waits for source %s: %s", mixer_state.step, s, feed.lag(s))
                    last_lag_log = time.monotonic()
                continue
            # STOP: an exhausted source cannot fill its share (stop), or every source ran out.
            self._finish(writer, feed, pool, mixer_state, exhausted)
            return

    def _read_to_end(self, feed: SourceTopicFeed, sources: Iterable[str]) -> bool:
        """Read ``sources``, which ran out, to their ends; False when stopped or the lease is lost first.

        A source that ran out is drawn from as a whole (all that is left of it), and its leftovers go out in
        the final steps. A constructor resuming after it ran out has not read again what lies past its low
        watermark: without this it would draw from part of it (steps differing from an uninterrupted run's)
        or end the job without the rest."""
        assert self._lease is not None
        while behind := sorted(s for s in sources if not feed.is_exhausted(s)):
            if self.stopping or not self._lease.poll():
                return False
            feed.fill(behind)
        return True

    def _finish(
        self,
        writer: StepWriter,
        feed: SourceTopicFeed,
        pool: SamplePool,
        mixer_state: MixerState,
        exhausted: set[str],
    ) -> None:
        """End the job. Unless the policy is ``stop``, and once every source has run out, what is left
        goes out in final steps, so every sample of finite sources is delivered exactly once."""
        all_out = set(exhausted) >= set(pool.sources) or all(feed.is_exhausted(s) for s in pool.sources)
        if self.spec.on_exhausted is not OnExhausted.STOP and all_out:
            assert self._lease is not None
            if not self._read_to_end(feed, pool.sources):
                return
            while not pool.empty():
                if (
                    self.options.max_steps is not None
                    and self.stats.steps_written + writer.in_flight >= self.options.max_steps
                ):
                    if writer.wait():
                        self._stopping = True
                    return
                while not self._trainers_allow(mixer_state.step):
                    if self.stopping or not self._lease.poll() or not self._flush(writer):
                        return
                candidates = pool.take_everything()
                assembled = assemble_step(mixer_state.step, candidates, self.spec.step, self.cost_model)
                if not assembled.delivered:
                    msg = f"step {mixer_state.step}: none of the {len(candidates)} remaining samples fits a step"
                    raise MixflowError(msg)
                pool.settle(assembled.delivered, assembled.deferred)
                next_mixer = MixerState(mixer_state.step + self.lanes, mixer_state.credit, mixer_state.long_credit)
                if not self._write(writer, feed, pool, assembled, next_mixer, exhausted, False):
                    return
                mixer_state = next_mixer
        last = mixer_state.step - self.lanes
        if self._write(writer, feed, pool, None, mixer_state, exhausted, True) and writer.wait():
            self.stats.finished = True
            log.info("job %s finished after step %d", self.out.job, last)

    @staticmethod
    def _flush(writer: StepWriter) -> bool:
        """Write the steps handed over while this one waits; False (logged) when a transaction aborted."""
        if writer.flush():
            return True
        log.warning("a transaction of steps was aborted; resuming from the last committed step")
        return False

    def _trainers_allow(self, step: int) -> bool:
        """With ``max_lead_steps``: whether ``step`` is close enough ahead of the slowest trainer to be drawn.
        Reports are read only when the last ones say no, then this waits up to 0.2 s for news (a trainer
        resumed from an older checkpoint is heard the next time the constructor waits)."""
        lead, progress = self.spec.constructor.max_lead_steps, self._progress
        if lead is None or progress is None:
            return True
        ranks = self.spec.step.ranks
        if lead_allows(step, progress.reported, ranks, lead):
            return True
        progress.read(0.2)
        if lead_allows(step, progress.reported, ranks, lead):
            return True
        if time.monotonic() - self._last_lead_log > self.options.lag_log_interval_s:
            rank, reached = slowest_rank(progress.reported, ranks)
            log.info(
                "step %d waits for the trainers: rank %d holds step %d, and max_lead_steps is %d",
                step,
                rank,
                reached,
                lead,
            )
            self._last_lead_log = time.monotonic()
        return False

    def _read_control(self, next_step: int) -> None:
        """Accept or refuse the mixture changes published since the last look; what is decided goes
        into the state record of the next step committed."""
        if self._control is None:
            return
        for record in self._control.read_available():
            if record.problem is not None:
                log.warning("ignoring a broken control record: %s", record.problem)
            elif record.change is not None:
                change = record.change
                # This lane builds no step between its last one and its next: a change from any of them
                # is in time for it.
                if reason := refusal(change, next_step - self.lanes + 1, self.spec.source_names):
                    log.warning("refusing mixture change %s from step %d: %s", change.id, change.from_step, reason)
                    self._refused = (*self._refused, change.id)[-MAX_REFUSED:]
                else:
                    log.info("mixture change %s: from step %d, shares %s", change.id, change.from_step, change.shares)
                    self._changes = (*self._changes, change)
        self._control_offset = self._control.next_offset

    # -- the transaction of one step --------------------------------------------------------------

    def _write(
        self,
        writer: StepWriter,
        feed: SourceTopicFeed,
        pool: SamplePool,
        assembled: AssembledStep | None,
        mixer: MixerState,
        exhausted: set[str],
        finished: bool,
    ) -> bool:
        """Hand one step (or, with ``assembled`` None, only the final state) to the writer, whose thread
        writes it while this one prepares the next. False when the step before it was aborted: this one is
        dropped, and the caller resumes from the last committed state."""
        positions = {**pool.positions(), **self._dormant}
        state = ConstructorState(
            mixer,
            positions,
            pool.deferred_refs(),
            tuple(sorted(exhausted)),
            finished,
            self._changes,
            self._control_offset,
            self._refused,
        )
        state_bytes = state.to_bytes()
        records: list[Record] = []
        if assembled is not None:
            for batch in assembled.batches:
                key, value, headers = encode_batch(batch)
                records.append((self.out.rank(batch.rank), value, key, headers, self.lane))
        if finished:
            # Readers of a finished job (lane) stop at this record instead of waiting for more steps.
            key, value, headers = encode_end_of_data(mixer.step)
            records += [(self.out.rank(rank), value, key, headers, self.lane) for rank in range(self.spec.step.ranks)]
        letters = list(feed.dead_letters)
        for letter in letters:
            key, value, headers = encode_dead_letter(letter)
            records.append((self.out.dlq, value, key, headers, 0))
        feed.dead_letters.clear()  # an aborted step makes the next attempt read them again
        records.append((self.out.state, state_bytes, batch_key(max(mixer.step - self.lanes, 0)), None, self.lane))
        offsets = [TopicPartition(self.sources_topics.src(s), self.lane, p.low) for s, p in state.positions.items()]

        def done() -> None:
            if assembled is not None:
                self._record(assembled, len(state_bytes))

        def committed() -> None:  # on the writer thread at once: the metrics do not wait for the next step
            self.metrics.step_committed(assembled, letters)

        written = mixer.step - self.lanes
        if not writer.write(PreparedStep(f"step {written}", records, offsets, done, committed)):
            log.warning("a step up to step %d was aborted; resuming from the last committed step", written)
            return False
        return True

    def _record(self, assembled: AssembledStep, state_bytes: int) -> None:
        costs = assembled.plan.rank_costs(assembled.lengths, self.cost_model)
        by_source: dict[str, int] = {}
        for c in assembled.delivered:
            by_source[c.ref.source] = by_source.get(c.ref.source, 0) + c.sample.length
        record = StepRecord(
            step=assembled.step,
            tokens=assembled.tokens,
            samples=len(assembled.delivered),
            deferred=len(assembled.deferred),
            state_bytes=state_bytes,
            max_rank_cost=float(costs.max()),
            mean_rank_cost=float(costs.mean()),
            tokens_by_source=by_source,
            packed=assembled.started,
        )
        self.stats.add(record)
        log.debug(
            "step %d: %d tokens, %d samples, %d deferred", record.step, record.tokens, record.samples, record.deferred
        )

    def _lane_step(self, after: MixerState) -> MixerState:
        """The mixer state after a step (whose ``step`` is one more) moved on to this lane's next step."""
        return after if self.lanes == 1 else replace(after, step=after.step - 1 + self.lanes)

    def _last_state(self, timeout_s: float = 60.0) -> ConstructorState:
        state = read_last_state(self.config, self.out, self.lane, timeout_s)
        if state is None:
            initial = replace(self.mixer.initial_state(), step=self.lane)  # a lane's first step is its number
            return self.options.start_state or ConstructorState.initial(initial)
        return state
