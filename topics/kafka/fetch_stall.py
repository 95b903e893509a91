"""Telling a consumer whose fetching stalled from one that has read all there is.

After a broker restart, a librdkafka client can keep a partition's leader as unknown for good: it stops
fetching the partition and says nothing (confluentinc/librdkafka#5430; seen here as a constructor, and a
chaos run's watch, that never read another record after a single-broker restart). Only a new client asks
the brokers afresh. A consumer with end-of-partition events on says where it stands after every fetch
that reached the end, so a partition that has said nothing for ``stall_after_s`` of consuming, while
committed records lie past where it is read, is stalled."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from topics.kafka.offset_lookup import OffsetLookup

STALL_AFTER_S = 15.0
# A caller that stopped consuming for this long (it had other work) did not wait on its partitions then:
# their quiet time starts again.
_CONSUMING_GAP_S = 2.0

Key = tuple[str, int]


def is_end_of_partition(message: Message) -> bool:
    error = message.error()
    return error is not None and error.code() == KafkaError._PARTITION_EOF


@dataclass(frozen=True)
class Stall:
    topic: str
    partition: int
    reading: int  # the offset of the next record the caller would get
    end: int  # where the partition's log ends (its last stable offset under read_committed)
    quiet_s: float

    def describe(self) -> str:
        return (
            f"reading {self.topic}[{self.partition}] stalled at offset {self.reading} although the log ends at "
            f"{self.end} (nothing for {self.quiet_s:.0f} s; confluentinc/librdkafka#5430)"
        )


class FetchStallWatch:
    """Fed the partitions a consumer reads, what it hands on (records and end-of-partition events) and
    when it consumes; ``stall()`` names a stalled partition. Offsets asked for, and the logical start
    offsets, count as where reading stands until the partition says otherwise."""

    def __init__(
        self, ends: OffsetLookup, stall_after_s: float = STALL_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ends = ends
        self.stall_after_s = stall_after_s
        self._clock = clock
        self.next: dict[Key, int] = {}  # per partition read, the offset of the next record to hand on
        self.paused: set[Key] = set()
        self._quiet_since: dict[Key, float] = {}
        self._heard: set[Key] = set()  # partitions that said something since the clock was last read
        self._checked_at: dict[Key, float] = {}
        self._last_call = clock()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these from now on."""
        self.next, self.paused = {}, set()
        self.add(partitions)

    def add(self, partitions: Iterable[TopicPartition]) -> None:
        now = self._clock()
        for p in partitions:
            key = (p.topic, p.partition)
            self.next[key] = p.offset
            self._quiet_since[key] = now
            self._checked_at.pop(key, None)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self.paused |= {(p.topic, p.partition) for p in partitions}

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        now = self._clock()
        for p in partitions:
            self.paused.discard((p.topic, p.partition))
            self._quiet_since[(p.topic, p.partition)] = now

    def restart(self) -> None:
        """A new client reads on from ``next``: every partition's quiet time starts again."""
        now = self._clock()
        self._quiet_since = dict.fromkeys(self.next, now)
        self._checked_at = {}

    def consuming(self) -> None:
        """The caller is about to consume."""
        now = self._hear(self._clock())
        if now - self._last_call > _CONSUMING_GAP_S:
            self._quiet_since = dict.fromkeys(self.next, now)
        self._last_call = now

    def saw(self, message: Message) -> bool:
        """Note where ``message`` says its partition is read; whether it is an end-of-partition event."""
        eof = is_end_of_partition(message)
        key = cast(Key, (message.topic(), message.partition()))  # set on records and partition events
        if (message.error() is None or eof) and key in self.next:
            self._note(key, message, eof)
        return eof

    def saw_all(self, messages: Sequence[Message]) -> None:
        """``saw`` for a batch: only each partition's last event counts, so the batch is read from its end
        and no further once every partition read has been met (after a few records, when all deliver)."""
        unmet = len(self.next)
        met: set[Key] = set()
        for message in reversed(messages):
            if not unmet:
                return
            key = cast(Key, (message.topic(), message.partition()))  # set on records and partition events
            if key in met:
                continue
            eof = is_end_of_partition(message)
            if message.error() is not None and not eof:
                continue
            met.add(key)
            if key in self.next:
                self._note(key, message, eof)
                unmet -= 1

    def _note(self, key: Key, message: Message, eof: bool) -> None:
        offset = cast(int, message.offset())  # set on records and end-of-partition events
        self.next[key] = offset if eof else offset + 1
        self._heard.add(key)  # the clock is read once per batch, not per record

    def _hear(self, now: float) -> float:
        for key in self._heard:
            self._quiet_since[key] = now
        self._heard.clear()
        return now

    def stall(self) -> Stall | None:
        """A partition, not paused, quiet for ``stall_after_s`` of consuming while committed records lie
        past where it is read; each partition is asked about at most once per ``stall_after_s``."""
        now = self._hear(self._clock())
        for key, since in self._quiet_since.items():
            if key not in self.next or key in self.paused or now - since < self.stall_after_s:
                continue
            if now - self._checked_at.get(key, since) < self.stall_after_s:
                continue
            self._checked_at[key] = now
            try:
                low, high = self.ends.watermarks(TopicPartition(*key), timeout_s=5.0)
            except KafkaException:
                continue  # the brokers are away: nothing to tell yet
            reading = self.next[key] if self.next[key] >= 0 else low  # a logical start: the log's start
            if high > reading:
                return Stall(key[0], key[1], reading, high, now - since)
        return None
