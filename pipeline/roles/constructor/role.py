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

This module holds the role's life (shadow or active, one attempt after another) and its bookkeeping; the
parts live beside it: ``shadow.py`` (following the job without the lease), ``loop.py`` (an attempt's step
loop around the step core of ``pipeline.planning.step.core``, and the job's last steps),
``control_intake.py`` (mixture changes), ``lead.py`` (pacing by the trainers), ``step_records.py`` (what a
step's transaction writes) and ``writer.py`` (the transactions, on a thread).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, replace

import numpy as np
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from pipeline.kafka.role_protocol import TransactionalRole, closing_unless_stuck
from pipeline.kafka.spec_record import record_spec
from pipeline.kafka.state_topic import read_last_state, written_shape
from pipeline.planning.mixing import Mixer, MixtureChange
from pipeline.planning.scheduler import plan_step
from pipeline.planning.scheduler.context_parallel import cp_shape_of
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import StepSummary, build_batches
from pipeline.planning.step.core import StepCore
from pipeline.planning.step.pool import SamplePool
from pipeline.planning.step.spec_change import carry_over, check_step_shape
from pipeline.planning.step.state import ConstructorState
from pipeline.roles.constructor.control_intake import ControlIntake
from pipeline.roles.constructor.gc_policy import freeze_start_up
from pipeline.roles.constructor.lead import ProgressReader, TrainerPacing
from pipeline.roles.constructor.lease import DEFAULT_SESSION_TIMEOUT_MS, ConstructorLease
from pipeline.roles.constructor.loop import StepLoop
from pipeline.roles.constructor.metrics import ConstructorMetrics
from pipeline.roles.constructor.shadow import ShadowEnd, ShadowFollower
from pipeline.roles.constructor.sources import SOURCE_FETCH_SETTINGS, SourceTopicFeed
from pipeline.roles.constructor.stats import DEFAULT_RECENT_STEPS, ConstructorStats, StepRecord
from pipeline.roles.constructor.step_records import StepRecords
from pipeline.roles.constructor.writer import StepWriter
from pipeline.spec import JobSpec
from topics.errors import MixflowError
from topics.formats.batch_codec import encode_batch
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.kafka.admin import ensure_job_topics
from topics.kafka.clients import KafkaConfig, ProducerFencedError, read_committed_settings
from topics.kafka.renewing_consumer import RenewingConsumer

log = logging.getLogger(__name__)


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
        self.shape = StepShape.from_spec(spec.step)
        self.core = StepCore(
            self.shape,
            self.cost_model,
            self.lanes,
            vision=spec.cost.vision_cost_model(),
            context_parallel=cp_shape_of(spec.step),
            cp_cost=spec.cost.context_parallel_cost(),
        )
        self.stats = ConstructorStats(options.recent_steps)
        self.metrics = metrics or ConstructorMetrics(CollectorRegistry(), self.out.job, spec)
        self.instance = options.instance or f"{socket.gethostname()}-{os.getpid()}"
        self._lease: ConstructorLease | None = None

    @property
    def transactional_id(self) -> str:
        """Also the group of its source offsets: one per lane (a job without lanes keeps the plain name)."""
        return f"{self.out.job}.constructor" + (f".lane{self.lane}" if self.lanes > 1 else "")

    def run(self) -> ConstructorStats:
        """Construct until the job is finished, ``max_steps`` are written or a signal stops it: as the
        active instance while this one holds the lease, as a shadow while another does."""
        self.stop_on_signals()
        check_step_shape(written_shape(self.config, self.out, self.lane), self.shape, self.out.job)
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
        """Load the scheduler's compiled kernels and what building and encoding a batch imports (pyarrow loads
        pandas on its first string array) now, not in the first step after a takeover; then put what start-up
        left alive out of the garbage collector's way (``gc_policy``)."""
        shape = self.shape
        lengths = np.ones(2, dtype=np.int64)
        plan_step(lengths, shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch, self.cost_model)
        plan = plan_step(lengths, 1, 1, shape.tokens_per_micro_batch, self.cost_model)
        samples = [Sample(f"warm-up/{i}", "warm-up", np.zeros(1, np.int32)) for i in range(2)]
        for batch in build_batches(0, plan, samples, lengths):
            encode_batch(batch)
        freeze_start_up()

    def _wait_as_shadow(self) -> bool:
        """Follow the job as a shadow until this instance holds the lease (True), or until the job is
        finished or a signal stops it (False)."""
        assert self._lease is not None
        stalled_s = max(15.0, 10 * self.options.lease_session_timeout_ms / 1000)
        follower = ShadowFollower(
            self._lease, self.instance, self.out.job, self._last_state, lambda: self.stopping, stalled_s
        )
        end = follower.follow()
        self.stats.finished = self.stats.finished or end is ShadowEnd.FINISHED
        return end is ShadowEnd.LEASE

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
        state = carried.state
        if state.finished:
            log.info("job %s finished at step %d already", self.out.job, state.step)
            self.stats.finished = True
            return
        log.info("constructor %s: resuming at step %d", self.transactional_id, state.step)
        record_spec(self, producer, self.out, self.spec, state.step)
        pool = SamplePool(state, self.core.vision)
        consumer = RenewingConsumer(
            read_committed_settings(
                {**SOURCE_FETCH_SETTINGS, **self.config},
                self.transactional_id,
                **{"enable.partition.eof": True},  # tells when a source has been read to its end
            )
        )
        feed = SourceTopicFeed(consumer, self.config, self.sources_topics, pool, self.mixer.budget_tokens, self.lane)
        closes = [feed.close, consumer.close]
        control = ControlIntake(state, self.options.replay_changes)
        if reader := control.open(self.config, self.out):
            closes.append(reader.close)
        progress = None  # with max_lead_steps: the trainers' reports
        if (lead := self.spec.constructor.max_lead_steps) is not None:
            progress = ProgressReader(self.config, self.out.job)
            closes.append(progress.close)
        per_transaction = self.spec.constructor.transaction_steps(self.spec.step.ranks)
        writer = StepWriter(self, producer, consumer, self.metrics.transaction_ended, per_transaction)
        closes.insert(0, writer.close)
        loop = StepLoop(
            self,
            self.spec,
            self.mixer,
            self.core,
            pool,
            feed,
            writer,
            StepRecords(self.out, self.sources_topics, self.lane, self.lanes, self.spec.step.ranks),
            control,
            TrainerPacing(progress, lead, self.spec.step.ranks, self.options.lag_log_interval_s),
            self.metrics,
            carried.dormant,
            self.options.lag_log_interval_s,
        )
        with closing_unless_stuck(*closes):
            try:
                loop.run(state)
            finally:
                if not writer.wait():
                    log.warning("the last step in flight was aborted; a restart resumes before it")

    # -- what the step loop asks of the role (``loop.LoopHost``) ----------------------------------

    def running(self) -> bool:
        assert self._lease is not None
        return not self.stopping and self._lease.poll()

    def at_max_steps(self, in_flight: int) -> bool:
        return self.options.max_steps is not None and self.stats.steps_written + in_flight >= self.options.max_steps

    def end_at_max_steps(self) -> None:
        self._stopping = True

    def step_done(self, step: StepSummary, state_bytes: int) -> None:
        self._record(step, state_bytes)

    def job_finished(self) -> None:
        self.stats.finished = True

    # -- bookkeeping ------------------------------------------------------------------------------

    def _record(self, step: StepSummary, state_bytes: int) -> None:
        record = StepRecord.of(step, self.cost_model, state_bytes)
        self.stats.add(record)
        log.debug(
            "step %d: %d tokens, %d samples, %d deferred", record.step, record.tokens, record.samples, record.deferred
        )

    def _last_state(self, timeout_s: float = 60.0) -> ConstructorState:
        state = read_last_state(self.config, self.out, self.lane, timeout_s)
        if state is None:
            initial = replace(self.mixer.initial_state(), step=self.lane)  # a lane's first step is its number
            return self.options.start_state or ConstructorState.initial(initial)
        return state
