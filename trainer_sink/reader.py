"""The reading thread of one rank: its rank topic from a position, handed to the trainer as micro-batches.

It holds one Kafka consumer with the partitions assigned (no consumer group: every tensor-, pipeline-
and context-parallel peer of a data-parallel rank reads the same topic with offsets of its own), reads
with ``read_committed``, and hands micro-batches to the trainer through a queue bounded in bytes. Its parts:
``start.py`` (where reading starts: the topic's lanes, the offset of the position's step in each),
``steps.py`` (the records polled, decoded and checked, in step order across lanes) and ``deliveries.py``
(each due micro-batch as tensors).

A trainer may never close what it iterates (a framework that stops at ``max_steps``): a reader still open
when the interpreter exits is closed by an exit handler, before finalization would stop its daemon thread
wherever it is (one stopped inside torch aborts the process: "terminate called without an active
exception").
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from topics.errors import MixflowError
from topics.kafka.renewing_consumer import RenewingConsumer
from trainer_sink.buffer import ByteBoundedQueue, Closed
from trainer_sink.deliveries import Delivery, EndOfData, due_deliveries
from trainer_sink.position import SinkPosition
from trainer_sink.read_options import ReadOptions
from trainer_sink.start import rank_topic_lanes, start_offsets
from trainer_sink.steps import RankTopicSteps, StepBatch

log = logging.getLogger(__name__)

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

_open_readers: weakref.WeakSet[RankTopicReader] = weakref.WeakSet()


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
        self._stop = threading.Event()
        self.steps = RankTopicSteps(self._config, position, rank, options, self._stop)
        self._thread = threading.Thread(target=self._run, name=f"mixflow-sink-{position.topic}", daemon=True)

    @property
    def last_step(self) -> int | None:
        """The step of the last batch read."""
        return self.steps.last_step

    def start(self) -> RankTopicReader:
        self._thread.start()
        _open_readers.add(self)
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
        _open_readers.discard(self)

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        topic = self.position.topic
        try:
            lanes = rank_topic_lanes(self._config, self.rank, topic, self.options, self._stop)
            if lanes is None:  # closed while waiting for the topic
                return
            # Found before the consumer exists: a consumer left idle meanwhile was seen to fetch 1 s late.
            starts = start_offsets(self._kafka_config, self.position, lanes)
        except BaseException as exc:  # handed to the trainer's thread, raised by get()
            self._hand_over(exc)
            return
        try:
            consumer = RenewingConsumer(self._config)
        except KafkaException as exc:
            self._hand_over(MixflowError(f"bad Kafka settings for the sink of {topic}: {exc}"))
            return
        try:
            consumer.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
            self._hand_over_steps(self.steps.read(consumer, lanes))
        except Closed:
            pass
        except BaseException as exc:  # handed to the trainer's thread, raised by get()
            self._hand_over(exc)
        finally:
            consumer.close()

    def _hand_over_steps(self, steps: Iterable[StepBatch | EndOfData]) -> None:
        """Queue each step's due micro-batches, then the end of data if the job ends."""
        for step in steps:
            if isinstance(step, EndOfData):
                self.queue.put(step, 0)
                return
            for delivery, size in due_deliveries(step.batch, step.offset, self.position, self.options):
                self.queue.put(delivery, size)

    def _hand_over(self, item: object) -> None:
        with contextlib.suppress(Closed):
            self.queue.put(item, 0)


@atexit.register
def _close_open_readers() -> None:
    for reader in list(_open_readers):
        reader.close()
