"""A sink's reports of how far its trainer has got, on ``<job>.progress`` (``topics/formats/progress.py``).

A constructor with ``constructor.max_lead_steps`` reads them to stay at most that many steps ahead of the
slowest rank. A report goes out at the end of each step the trainer takes, at most every
``REPORT_INTERVAL_S``, and the latest goes out again every ``REPEAT_S``: a report lost on the way (a sink
killed before it was delivered, a producer that a broker restart left unable to deliver) is made good, and
a resumed trainer reports the step its checkpoint holds before it takes another. Failures to report are
logged once and never raised: a trainer must not stop because the constructor cannot hear from it (a
constructor that cannot hear waits, and says so)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Producer

from topics.formats.names import JobTopics
from topics.formats.progress import encode_progress

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 0.5
"""A rank reports at most this often; a constructor waiting on it hears within about this long."""
REPEAT_S = 5.0
"""The latest report goes out again this often (the topic is compacted: repeats cost nothing there)."""
DELIVERY_TIMEOUT_MS = 10_000
"""A report not delivered within this long fails, and the next goes out on a new producer."""


class ProgressReporter:
    def __init__(self, kafka_config: Mapping[str, object], job: str, rank: int) -> None:
        self.topic = JobTopics(job).progress
        self.rank = rank
        consumer_only = ("group.", "isolation.", "enable.auto", "auto.offset", "fetch.", "max.partition")
        self._settings = {
            **{k: v for k, v in kafka_config.items() if not k.startswith(consumer_only)},
            "linger.ms": 20,
            "acks": 1,
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            "error_cb": self._on_error,
        }
        self._producer: Producer | None = Producer(self._settings)
        self._undelivered = False  # a report failed: the producer is replaced before the next
        self.producers = 1
        self._warned = False
        self._disabled = not self._topic_exists()
        self._reported = -1
        self._pending: int | None = None  # a finished step not reported yet (the interval had not passed)
        self._last_sent = -REPORT_INTERVAL_S
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # started at the first report held back

    def _topic_exists(self) -> bool:
        """False for a job without a progress topic: reports would only time out."""
        assert self._producer is not None
        try:
            metadata = self._producer.list_topics(self.topic, timeout=10)
        except KafkaException as exc:
            self._warn(f"cannot look up the progress topic: {exc}")
            return False
        if (topic := metadata.topics.get(self.topic)) is None or topic.error is not None:
            log.info("rank %d: no topic %s (a job of an older mixflow); reporting no progress", self.rank, self.topic)
            return False
        return True

    def handed_out(self, step: int, micro_batch: int, micro_batches: int) -> None:
        """The trainer has taken micro-batch ``micro_batch`` of ``micro_batches`` of ``step``: once it is
        the step's last, the trainer holds the step whole."""
        if micro_batch == micro_batches - 1:
            self.holds(step)

    def holds(self, step: int) -> None:
        """The trainer holds every step up to ``step`` whole (taken, or in the checkpoint it resumed from):
        the report goes out within the interval, from the reporter's thread if the trainer does not come
        back (it may be waiting for a step that the constructor holds back until it hears of this one)."""
        if self._disabled or step < 0:
            return
        with self._lock:
            if step > self._reported:
                self._pending = step
        if time.monotonic() - self._last_sent >= REPORT_INTERVAL_S:
            self._send_pending()
        if self._thread is None:  # sends what the interval held back, and repeats the latest
            self._thread = threading.Thread(target=self._run, name=f"mixflow-progress-{self.rank}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REPORT_INTERVAL_S / 2):
            self._send_pending()
            if time.monotonic() - self._last_sent >= REPEAT_S:
                with self._lock:
                    self._send(self._reported)

    def _send_pending(self) -> None:
        with self._lock:
            step, self._pending = self._pending, None
            if step is not None and step > self._reported:
                self._send(step)

    def _send(self, step: int) -> None:
        """Report ``step`` (the lock held)."""
        if step < 0 or self._producer is None:
            return
        if self._undelivered:
            self._replace_producer()
        key, value = encode_progress(self.rank, step)
        try:
            self._producer.produce(self.topic, value, key=key, on_delivery=self._delivered)
        except (BufferError, KafkaException) as exc:
            self._warn(f"cannot queue a progress report: {exc}")
            return
        self._reported, self._last_sent = step, time.monotonic()
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self._undelivered = True
            self._warn(f"a progress report was not delivered: {error}")

    def _replace_producer(self) -> None:
        """After a report failed: a producer that a broker restart left unable to deliver stays so
        (confluentinc/librdkafka#5430), and a new one asks the brokers afresh."""
        if (old := self._producer) is not None:
            old.purge()
            old.flush(0)
        self._producer = Producer(self._settings)
        self._undelivered = False
        self.producers += 1

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._warn(f"the progress producer failed: {error}")

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("rank %d: %s (on %s; a constructor with max_lead_steps waits)", self.rank, what, self.topic)

    def close(self) -> None:
        """Send a finished step still held back by the interval, wait briefly for delivery, and free the
        client now: its callbacks hold this object, so only the cycle collector would, maybe in a process
        forked later (a DataLoader worker), where destroying a Kafka client crashes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self._disabled:
            self._send_pending()
        self._disabled = True
        if (producer := self._producer) is not None:
            self._producer = None
            producer.flush(2)
