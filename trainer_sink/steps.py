"""A rank topic's records as the steps a reader hands over: polled (waiting, and saying so, while the
constructor is behind, up to the wait timeout), decoded, checked against the position and each other, and
on a topic of several constructor lanes taken from the partitions in step order (step ``k`` from partition
``k mod lanes``, ``topics/formats/lanes.py``)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from topics.errors import DecodeError, MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.lanes import LaneOrder
from topics.kafka.authorization import raise_if_read_refused
from topics.kafka.renewing_consumer import RenewingConsumer
from trainer_sink.deliveries import EndOfData
from trainer_sink.position import SinkPosition
from trainer_sink.read_options import ReadOptions

log = logging.getLogger(__name__)

POLL_S = 0.2
LANE_READ_AHEAD = 2
"""Records held per rank-topic partition of a lane that is not due; above it the partition is paused."""


class SinkTimeoutError(MixflowError):
    """No new step arrived within the sink's wait timeout."""


class StepBatch(NamedTuple):
    """A step's batch for this rank, and the offset to resume from (None on a topic of several lanes)."""

    batch: Batch | CPBatch
    offset: int | None


class RankTopicSteps:
    """The steps of rank ``rank``'s topic from ``position``, read through a consumer assigned there."""

    def __init__(
        self,
        config: Mapping[str, Any],
        position: SinkPosition,
        rank: int,
        options: ReadOptions,
        stopped: threading.Event,
    ) -> None:
        self.position = position
        self.rank = rank
        self.options = options
        self.last_step: int | None = None  # of the last batch read
        self._config = config
        self._stopped = stopped

    def read(self, consumer: RenewingConsumer, lanes: int) -> Iterator[StepBatch | EndOfData]:
        """Every step's batch in order, then ``EndOfData`` if the job ends; nothing more once stopped."""
        messages = self.messages(consumer)
        return self.one_lane(messages) if lanes == 1 else self.in_lane_order(messages, consumer, lanes)

    def one_lane(self, messages: Iterator[Message]) -> Iterator[StepBatch | EndOfData]:
        """Decode each message and check its step, up to the end-of-data record."""
        last_step: int | None = None
        for message in messages:
            steps = _end_of_data(message)
            if steps is not None:
                self._check_end(message, steps, last_step)
                yield EndOfData(steps)
                return
            batch = decode_any_batch_message(message)
            self._check_step(message, batch.step, batch.rank, last_step)
            self._check_shape(message, batch)
            last_step = self.last_step = batch.step
            yield StepBatch(batch, message.offset())

    def in_lane_order(
        self, messages: Iterator[Message], consumer: RenewingConsumer, lanes: int
    ) -> Iterator[StepBatch | EndOfData]:
        """``one_lane`` for a topic of several lanes: step ``k`` from partition ``k mod lanes``, a lane
        dropping out at its end-of-data record, the end once every lane has ended. A partition holding
        ``LANE_READ_AHEAD`` records while another is due is paused."""
        order = LaneOrder(lanes, self.position.step or 0)
        topic = self.position.topic
        buffers: dict[int, deque[Message]] = {p: deque() for p in range(lanes)}
        paused: set[int] = set()
        last_step: int | None = None
        while not order.done:
            due = order.partition()
            if due in paused:
                consumer.resume([TopicPartition(topic, due)])
                paused.discard(due)
            while not buffers[due]:
                message = next(messages, None)
                if message is None:  # stopped
                    return
                buffers[cast(int, message.partition())].append(message)  # a record's partition is set
                full = {p for p, held in buffers.items() if len(held) >= LANE_READ_AHEAD and p != due}
                if pause := full - paused:
                    consumer.pause([TopicPartition(topic, p) for p in pause])
                    paused |= pause
            message = buffers[due].popleft()
            steps = _end_of_data(message)
            if steps is not None:
                if problem := order.end(due, steps):
                    raise DecodeError.of_record(problem, message)
                continue
            batch = decode_any_batch_message(message)
            if batch.rank != self.rank:
                raise DecodeError.of_record(
                    f"the batch is for rank {batch.rank}, this reader is rank {self.rank}", message
                )
            if problem := order.batch(due, batch.step):
                raise DecodeError.of_record(f"{problem}: steps are missing or repeated", message)
            self._check_shape(message, batch)
            last_step = self.last_step = batch.step
            yield StepBatch(batch, None)
        yield EndOfData(last_step + 1 if last_step is not None else order.next_step)

    # -- polling ------------------------------------------------------------------------------------

    def messages(self, consumer: RenewingConsumer) -> Iterator[Message]:
        """The topic's committed records, waiting (and logging) while there are none, up to the timeout."""
        waiting_since = last_log = time.monotonic()
        while not self._stopped.is_set():
            message = consumer.poll(POLL_S)
            error = message.error() if message is not None else None
            if message is not None and error is None:
                yield message
                waiting_since = last_log = time.monotonic()  # includes the time the trainer took to take it
                continue
            if error is not None:
                self._check_error(error)
            if time.monotonic() - last_log > self.options.wait_log_interval_s:  # at a level training scripts show
                log.warning("%s", self._waiting(consumer, time.monotonic() - waiting_since))
                last_log = time.monotonic()
            if time.monotonic() - waiting_since > self.options.wait_timeout_s:
                raise SinkTimeoutError(self._waiting(consumer, time.monotonic() - waiting_since))

    def _check_error(self, error: KafkaError) -> None:
        raise_if_read_refused(self._config, error, self.position.topic)
        if error.fatal() or not (error.retriable() or error.code() == KafkaError._TRANSPORT):
            msg = f"reading {self.position.topic}: {error}"
            raise MixflowError(msg)
        log.warning("reading %s: %s (retrying)", self.position.topic, error)

    def _waiting(self, consumer: RenewingConsumer, seconds: float) -> str:
        topic, partition = self.position.topic, self.position.partition
        last_step = self.last_step
        if last_step is not None:
            due = f"step {last_step + 1}"
        else:
            due = "the first step" if self.position.step is None else f"step {self.position.step}"
        try:
            offset = consumer.position([TopicPartition(topic, partition)])[0].offset
            high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=2.0)[1]
            where = f"reading at offset {max(offset, 0)}, the log ends at offset {high}"
            if high > offset >= 0:
                where += " (what lies past the read position is not committed yet: a step is being written)"
        except KafkaException as exc:
            where = f"the broker does not answer: {exc.args[0]}"
        if last_step is not None:
            written = f"the constructor has committed up to step {last_step}"
        else:
            written = "nothing committed past the start position yet: is the job's constructor running?"
        return f"rank {self.rank} has waited {seconds:.0f} s for {due} on {topic} ({where}; {written})"

    # -- checks -------------------------------------------------------------------------------------

    def _first_step_allowed(self, step: int) -> bool:
        """Whether a resumed reader's first message may hold ``step``: the step of the position, or the
        one before it when that step was delivered whole (the position then points at its message). A
        position found by step reads from before its step when that step was not written yet."""
        due = self.position.step
        if due is None:
            return True
        if self.position.seeks_step:
            return step <= due
        return step == due or (step == due - 1 and self.position.micro_batch == 0)

    def _check_step(self, message: Message, step: int, rank: int, last_step: int | None) -> None:
        if rank != self.rank:
            raise DecodeError.of_record(f"the batch is for rank {rank}, this reader is rank {self.rank}", message)
        if last_step is None and not self._first_step_allowed(step):
            msg = (
                f"resuming at step {self.position.step} micro-batch {self.position.micro_batch} from offset "
                f"{self.position.offset}, but the message there holds step {step}: the checkpoint does not "
                "belong to this topic, or its records were deleted"
            )
            raise DecodeError.of_record(msg, message)
        if last_step is not None and step != last_step + 1:
            raise DecodeError.of_record(f"step {step} follows step {last_step}: steps are missing or repeated", message)

    def _check_shape(self, message: Message, batch: Batch | CPBatch) -> None:
        """A position in the middle of a step, carried over from another topic, needs the step to have the
        same shape here: otherwise the micro-batches trained already hold other samples than this topic's."""
        position = self.position
        if batch.step != position.step or not position.micro_batch or position.ranks is None:
            return
        if (batch.ranks, batch.micro_batches) != (position.ranks, position.micro_batches):
            msg = (
                f"cannot resume in the middle of step {batch.step} (at micro-batch {position.micro_batch}) on "
                f"{message.topic()}: the state was saved where the step had {position.micro_batches} micro-batches "
                f"on {position.ranks} ranks, here it has {batch.micro_batches} on {batch.ranks}; resume from a "
                "checkpoint taken at a step boundary"
            )
            raise MixflowError(msg)

    def _check_end(self, message: Message, steps: int, last_step: int | None) -> None:
        expected = last_step + 1 if last_step is not None else self.position.step
        if expected is not None and steps != expected:
            msg = f"the job ended after {steps} steps, but the next step due here is {expected}"
            raise DecodeError.of_record(msg, message)


def _end_of_data(message: Message) -> int | None:
    """The steps an end-of-data record says its job (lane) wrote; None for a batch."""
    try:
        return end_of_data_steps(message.headers())
    except ValueError as exc:
        raise DecodeError.of_record(str(exc), message) from exc
