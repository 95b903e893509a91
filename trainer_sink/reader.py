"""The reading thread of one rank: its rank topic from a position, decoded into micro-batches.

It holds one Kafka consumer with the partition assigned (no consumer group: every tensor-, pipeline-
and context-parallel peer of a data-parallel rank reads the same topic with offsets of its own), reads
with ``read_committed``, checks that steps follow each other, and hands micro-batches to the trainer
through a queue bounded in bytes.

A job built by constructor lanes has a rank-topic partition per lane, and step ``k`` in partition
``k mod C`` (``topics/lanes.py``): the reader then takes the partitions in turn, step by step, and
resumes by step number in each of them (``topics/step_index.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from topics.authorization import raise_if_read_refused
from topics.batch import Batch
from topics.batch_codec import decode_batch_message, end_of_data_steps
from topics.errors import DecodeError, MixflowError
from topics.lanes import LaneOrder, first_step_at_or_after
from topics.renewing_consumer import RenewingConsumer
from topics.step_index import locate_step
from trainer_sink.buffer import ByteBoundedQueue, Closed
from trainer_sink.open_readers import open_readers
from trainer_sink.position import SinkPosition
from trainer_sink.read_options import ReadOptions
from trainer_sink.tensors import MicroBatch, micro_batch_tensors, nbytes

log = logging.getLogger(__name__)

POLL_S = 0.2
LANE_READ_AHEAD = 2
"""Records held per rank-topic partition of a lane that is not due; above it the partition is paused."""

CONSUMER_SETTINGS = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": False,
    # librdkafka's own read-ahead: enough for a few batches, bounded so memory stays flat. A fetch may
    # overshoot it (the broker returns at least one whole batch, however large); the reader then backs off
    # for this long before fetching again (1 s by default: a stall per fetch).
    "queued.max.messages.kbytes": 32_768,
    "fetch.queue.backoff.ms": 10,
}
"""The librdkafka settings of every sink consumer (after the caller's own, which they override)."""


class SinkTimeoutError(MixflowError):
    """No new step arrived within the sink's wait timeout."""


@dataclass(frozen=True)
class Delivery:
    """One micro-batch and where it came from."""

    tensors: MicroBatch
    offset: int | None  # None on a topic of several lanes: a position there is found again by step
    step: int
    micro_batch: int
    micro_batches: int
    ranks: int


@dataclass(frozen=True)
class EndOfData:
    steps: int


class RankTopicReader:
    """Reads ``position.topic`` from ``position`` on a background thread; ``get()`` hands over each
    due micro-batch as a ``Delivery``, then one ``EndOfData`` if the job ends. An error on the
    thread (a corrupt batch, a gap in the steps, a wait past the timeout) is raised by ``get()``."""

    def __init__(self, kafka_config: Mapping[str, Any], position: SinkPosition, rank: int, options: ReadOptions):
        self.position = position
        self.rank = rank
        self.options = options
        self.queue = ByteBoundedQueue(options.prefetch_bytes)
        self._kafka_config = kafka_config
        self._config = {
            **kafka_config,
            "group.id": f"mixflow-sink-{uuid.uuid4().hex[:12]}",  # required, never joined or committed
            **CONSUMER_SETTINGS,
        }
        self.last_step: int | None = None  # of the last batch read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mixflow-sink-{position.topic}", daemon=True)

    def start(self) -> RankTopicReader:
        self._thread.start()
        open_readers.add(self)
        return self

    def get(self) -> Delivery | EndOfData:
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def deliveries(self) -> Iterator[Delivery]:
        """Every ``get()`` up to the end of data."""
        while not isinstance(item := self.get(), EndOfData):
            yield item
        log.info("%s: end of data after %d steps", self.position.topic, item.steps)

    def close(self) -> None:
        self._stop.set()
        self.queue.close()
        self._thread.join(timeout=30)
        open_readers.discard(self)

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            lanes = self._lanes()
            # Found before the consumer exists: a consumer left idle meanwhile was seen to fetch 1 s late.
            starts = {self.position.partition: self._start_offset()} if lanes == 1 else self._lane_offsets(lanes)
        except BaseException as exc:  # handed to the trainer's thread, raised by get()
            self._hand_over(exc)
            return
        try:
            consumer = RenewingConsumer(self._config)
        except KafkaException as exc:
            self._hand_over(MixflowError(f"bad Kafka settings for the sink of {self.position.topic}: {exc}"))
            return
        try:
            consumer.assign([TopicPartition(self.position.topic, p, start) for p, start in starts.items()])
            if lanes == 1:
                self._read(consumer)
            else:
                self._hand_over_lanes(consumer, lanes)
        except Closed:
            pass
        except BaseException as exc:  # handed to the trainer's thread, raised by get()
            self._hand_over(exc)
        finally:
            consumer.close()

    def _lanes(self) -> int:
        """The partitions of the rank topic: the job's constructor lanes. Waits (up to the wait timeout) for
        a topic not created yet."""
        topic = self.position.topic
        admin = Consumer({**self._config, "group.id": f"mixflow-sink-meta-{uuid.uuid4().hex[:12]}"})
        try:
            began = last_log = time.monotonic()
            while not self._stop.is_set():
                described = admin.list_topics(topic, timeout=10).topics.get(topic)
                if described is not None and described.error is None and described.partitions:
                    return len(described.partitions)
                if time.monotonic() - began > self.options.wait_timeout_s:
                    msg = f"rank topic {topic} does not exist after {self.options.wait_timeout_s:.0f} s"
                    raise SinkTimeoutError(msg)
                if time.monotonic() - last_log > self.options.wait_log_interval_s:
                    log.warning("rank %d has waited %.0f s for %s to exist", self.rank, time.monotonic() - began, topic)
                    last_log = time.monotonic()
                self._stop.wait(POLL_S)  # a topic that does not exist yet has nothing to wait on
            raise Closed
        finally:
            admin.close()

    def _lane_offsets(self, lanes: int) -> dict[int, int]:
        """Per partition, where reading starts: its first record of the position's step or a later one, or
        its end-of-data record (a lane that ended before that step)."""
        topic, step = self.position.topic, self.position.step
        if step is None:
            return dict.fromkeys(range(lanes), OFFSET_BEGINNING)
        offsets = {}
        for lane in range(lanes):
            wanted = first_step_at_or_after(step, lane, lanes)
            offsets[lane] = locate_step(self._kafka_config, topic, wanted, partition=lane, stop_at_end=True).offset
        return offsets

    def _start_offset(self) -> int:
        """Where reading starts: the position's offset, or for a position carried over from another topic
        the record of its step, found by step number (see ``topics.step_index``)."""
        topic, step = self.position.topic, self.position.step
        if self.position.offset is not None or step is None:
            return OFFSET_BEGINNING if self.position.offset is None else self.position.offset
        location = locate_step(self._kafka_config, topic, step, partition=self.position.partition)
        record = location.record
        if record is None:
            log.info("%s holds no step %d yet; waiting for it", topic, step)
        elif record.end and record.step < step:
            msg = f"cannot resume at step {step} on {topic}: its job ended after {record.step} steps"
            raise MixflowError(msg)
        elif record.step > step:
            first = f"the end of the job after {record.step} steps" if record.end else f"step {record.step}"
            msg = f"cannot resume at step {step} on {topic}: it holds no step {step}; the first record after is {first}"
            raise MixflowError(msg)
        return location.offset

    def _hand_over(self, item: object) -> None:
        with contextlib.suppress(Closed):
            self.queue.put(item, 0)

    def _read(self, consumer: RenewingConsumer) -> None:
        self._hand_over_all(self._messages(consumer))

    def _hand_over_all(self, messages: Iterator[Message]) -> None:
        """Decode each message, check its step, and queue its due micro-batches; stop at the end record."""
        last_step: int | None = None
        for message in messages:
            steps = self._end_of_data(message)
            if steps is not None:
                self._check_end(message, steps, last_step)
                self.queue.put(EndOfData(steps), 0)
                return
            batch = decode_batch_message(message)
            self._check_step(message, batch.step, batch.rank, last_step)
            self._check_shape(message, batch)
            last_step = self.last_step = batch.step
            self._queue_micro_batches(batch, message.offset())

    def _queue_micro_batches(self, batch: Batch, offset: int | None) -> None:
        options = self.options
        try:
            micro_batches = micro_batch_tensors(
                batch,
                options.tensor_layout,
                pad_token_id=options.pad_token_id,
                attention_mask=options.attention_mask,
                pad_to_multiple_of=options.pad_to_multiple_of,
                pixels=options.pixels,
            )
        except DecodeError as exc:  # a JPEG or PNG frame that does not decode to its item's size
            raise DecodeError(f"step {batch.step}: {exc.reason}", topic=self.position.topic, offset=offset) from exc
        for m, tensors in enumerate(micro_batches):
            if not self.position.is_due(batch.step, m):
                continue
            if self.options.pin_memory:
                tensors = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
            delivery = Delivery(tensors, offset, batch.step, m, batch.micro_batches, batch.ranks)
            self.queue.put(delivery, nbytes(tensors))

    def _hand_over_lanes(self, consumer: RenewingConsumer, lanes: int) -> None:
        """``_hand_over_all`` for a topic of several lanes: step ``k`` from partition ``k mod lanes``, a lane
        dropping out at its end-of-data record, the end once every lane has ended."""
        order = LaneOrder(lanes, self.position.step or 0)
        topic = self.position.topic
        buffers: dict[int, deque[Message]] = {p: deque() for p in range(lanes)}
        paused: set[int] = set()
        messages = self._messages(consumer)
        last_step: int | None = None
        while not order.done:
            due = order.partition()
            if due in paused:
                consumer.resume([TopicPartition(topic, due)])
                paused.discard(due)
            while not buffers[due]:
                message = next(messages, None)
                if message is None:  # closed
                    return
                buffers[message.partition()].append(message)
                full = {p for p, held in buffers.items() if len(held) >= LANE_READ_AHEAD and p != due}
                if pause := full - paused:
                    consumer.pause([TopicPartition(topic, p) for p in pause])
                    paused |= pause
            message = buffers[due].popleft()
            where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
            steps = self._end_of_data(message)
            if steps is not None:
                if problem := order.end(due, steps):
                    raise DecodeError(problem, **where)
                continue
            batch = decode_batch_message(message)
            if batch.rank != self.rank:
                raise DecodeError(f"the batch is for rank {batch.rank}, this reader is rank {self.rank}", **where)
            if problem := order.batch(due, batch.step):
                raise DecodeError(f"{problem}: steps are missing or repeated", **where)
            self._check_shape(message, batch)
            last_step = self.last_step = batch.step
            self._queue_micro_batches(batch, None)
        self.queue.put(EndOfData(last_step + 1 if last_step is not None else order.next_step), 0)

    def _messages(self, consumer: RenewingConsumer) -> Iterator[Message]:
        """The topic's committed records, waiting (and logging) while there are none, up to the timeout."""
        waiting_since = last_log = time.monotonic()
        while not self._stop.is_set():
            message = consumer.poll(POLL_S)
            if message is not None and message.error() is None:
                yield message
                waiting_since = last_log = time.monotonic()  # includes the time the trainer took to take it
                continue
            if message is not None:
                self._check_error(message.error())
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

    def _end_of_data(self, message: Message) -> int | None:
        try:
            return end_of_data_steps(message.headers())
        except ValueError as exc:
            raise DecodeError(
                str(exc), topic=message.topic(), partition=message.partition(), offset=message.offset()
            ) from exc

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
        where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
        if rank != self.rank:
            raise DecodeError(f"the batch is for rank {rank}, this reader is rank {self.rank}", **where)
        if last_step is None and not self._first_step_allowed(step):
            msg = (
                f"resuming at step {self.position.step} micro-batch {self.position.micro_batch} from offset "
                f"{self.position.offset}, but the message there holds step {step}: the checkpoint does not "
                "belong to this topic, or its records were deleted"
            )
            raise DecodeError(msg, **where)
        if last_step is not None and step != last_step + 1:
            raise DecodeError(f"step {step} follows step {last_step}: steps are missing or repeated", **where)

    def _check_shape(self, message: Message, batch: Batch) -> None:
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
            raise DecodeError(msg, topic=message.topic(), partition=message.partition(), offset=message.offset())

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
