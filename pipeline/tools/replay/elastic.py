"""Replay a job's steps under another step shape: the same samples per step, planned again over the new
ranks, written with the original's state record of each step, one transaction per step.

The state record of step ``k`` is the original's (but for the offset of the control topic, which is the
replayed job's own): the same samples were delivered, so the sources stand where they stood, and
``mixflow construct --output-job`` continues the replayed job from there under a spec of the new shape.
A killed replay resumes after the last step it committed. A context-parallel job's steps (batches of format
version 2 or 3) are put back together from their slices and planned again as such (``reshape_cp``).
"""

from __future__ import annotations

import contextlib
import logging

from confluent_kafka import Message, Producer, TopicPartition

from pipeline.kafka.role_protocol import TransactionalRole
from pipeline.kafka.state_topic import JobHistory, StateRecord
from pipeline.planning.scheduler import CostModel
from pipeline.planning.scheduler.cp_plan import CPShape
from pipeline.planning.shape import StepShape
from pipeline.spec.cost import VisionCostModel
from pipeline.spec.cp_cost import ContextParallelCost
from pipeline.tools.replay.plan import adopted
from pipeline.tools.replay.reshape import reshape_step
from pipeline.tools.replay.reshape_cp import reshape_cp_step
from pipeline.tools.replay.steps import read_steps
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import (
    CP_BATCH_FORMAT_VERSIONS,
    decode_any_batch_message,
    decode_batch_message,
    encode_batch,
    encode_end_of_data,
)
from topics.formats.cp_batch import CPBatch
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics
from topics.kafka.clients import KafkaConfig, produce

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""Tries of one step's transaction before the replay gives up (an abort is retried at once)."""


class ElasticReplay(TransactionalRole):
    kind = "replay"
    work_unit = "step"

    def __init__(
        self,
        config: KafkaConfig,
        original: JobHistory,
        target: str,
        shape: StepShape,
        cost_model: CostModel,
        transaction_timeout_ms: int = 60_000,
        vision: VisionCostModel | None = None,
        context_parallel: CPShape | None = None,
        cp_cost: ContextParallelCost | None = None,
    ) -> None:
        super().__init__(config, transaction_timeout_ms)
        if original.shape is None:
            msg = f"job {original.job} has no steps to replay"
            raise MixflowError(msg)
        self.original = original
        self.original_ranks = original.shape.ranks
        self.out = JobTopics(target)
        self.ranks = shape.ranks
        self.micro_batches = shape.micro_batches
        self.cost_model = cost_model
        self.vision = vision  # the encoder's cost, added to a multimodal sample's (None: the LLM's alone)
        self.context_parallel = context_parallel  # a context-parallel job's new shape (its ranks are ``shape``'s)
        self.cp_cost = cp_cost or ContextParallelCost()
        self.written = range(0)  # the steps written, consecutive
        self.finished = False

    @property
    def transactional_id(self) -> str:
        # The constructor's id for the target job: whichever of the two writes it fences the other.
        return f"{self.out.job}.constructor"

    def run(self, first: int, last: int, end: bool) -> range:
        """Write steps ``first`` to ``last``, then, with ``end``, the end of the job; the steps written."""
        self.stop_on_signals()
        ensure_job_topics(self.config, self.out.job, [], self.ranks)
        producer = self.new_producer()
        cp = self.context_parallel
        log.info(
            "replaying steps %d to %d of %s into %s over %d ranks x %d micro-batches%s%s",
            first,
            last,
            self.original.job,
            self.out.job,
            self.ranks,
            self.micro_batches if cp is None else cp.micro_batches,
            "" if cp is None else f" ({cp.mode.value} context parallelism, blocks of up to {cp.size} ranks)",
            ", then its end" if end else "",
        )
        steps = read_steps(self.config, self.original.job, self.original_ranks, first, last, end=end)
        try:
            with contextlib.closing(steps):
                for step in steps:
                    if self.stopping:
                        break
                    if step.end:
                        self._commit(producer, step.step, [], self._state(self.original.final(), step.step))
                        self.finished = True
                        break
                    reshaped = self._reshaped(step.messages)
                    self._commit(
                        producer, step.step, reshaped, self._state(self.original.before(step.step + 1), step.step)
                    )
                    self.written = range(self.written.start if self.written else step.step, step.step + 1)
        finally:
            producer.flush(30)
        return self.written

    def _reshaped(self, messages: list[Message]) -> list[Batch] | list[CPBatch]:
        """One step's records (one per original rank) planned again over the new shape."""
        if self.context_parallel is None:
            batches = [decode_batch_message(m) for m in messages]
            return reshape_step(batches, self.ranks, self.micro_batches, self.cost_model, self.vision)
        slices = [decode_any_batch_message(m, CP_BATCH_FORMAT_VERSIONS) for m in messages]
        return reshape_cp_step([b for b in slices if isinstance(b, CPBatch)], self.context_parallel, self.cp_cost)

    def _state(self, record: StateRecord | None, step: int) -> tuple[bytes | None, bytes]:
        """The key and value of the state record to write with ``step``: the original's state there."""
        if record is None:
            msg = f"job {self.original.job} has no state record for step {step} to replay"
            raise MixflowError(msg)
        return record.key, adopted(record.state).to_bytes()

    def _commit(
        self, producer: Producer, step: int, batches: list[Batch] | list[CPBatch], state: tuple[bytes | None, bytes]
    ) -> None:
        """One step's batches (or, with none, the end-of-data records) and its state record, in one transaction."""

        def produce_step() -> list[TopicPartition]:
            for batch in batches:
                key, value, headers = encode_batch(batch)
                produce(producer, self.out.rank(batch.rank), value, key=key, headers=headers)
            if not batches:
                key, value, headers = encode_end_of_data(step)
                for rank in range(self.ranks):
                    produce(producer, self.out.rank(rank), value, key=key, headers=headers)
            key, value = state
            produce(producer, self.out.state, value, key=key)
            return []

        what = f"step {step}" if batches else "the end of the job"
        for _ in range(ATTEMPTS):
            if self.transaction(producer, None, produce_step, what):
                return
        msg = f"replaying {what} into {self.out.job}: the transaction aborted {ATTEMPTS} times"
        raise MixflowError(msg)
