"""How far ahead of its trainers the constructor may run (``constructor.max_lead_steps``).

Each rank's sink reports on ``<job>.progress`` the last step its trainer holds whole
(``trainer_sink/progress.py``). With ``max_lead_steps`` N the constructor draws step k only while
``k - slowest <= N``, where ``slowest`` is the smallest step any rank reported (-1 for a rank that has
reported nothing: a job whose trainers have not started gets N + 1 steps ahead, then waits). That bounds
what the brokers hold unread and how late a mixture change reaches the trainers, and it paces a
constructor that is faster than its trainers, so that loaders are scaled by what the trainers take.
Reports only delay steps, never change them: exactly-once and determinism do not depend on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, TopicPartition

from topics.errors import DecodeError
from topics.formats.names import JobTopics
from topics.formats.progress import decode_progress
from topics.kafka.renewing_consumer import RenewingConsumer

log = logging.getLogger(__name__)


def slowest_rank(reported: Mapping[int, int], ranks: int) -> tuple[int, int]:
    """``(rank, step)`` of the rank furthest behind, the lowest rank among equals (step -1: none reported)."""
    step, rank = min((reported.get(r, -1), r) for r in range(ranks))
    return rank, step


def lead_allows(next_step: int, reported: Mapping[int, int], ranks: int, max_lead: int) -> bool:
    """Whether the constructor may draw ``next_step``, rank r having reported ``reported[r]``."""
    return next_step - slowest_rank(reported, ranks)[1] <= max_lead


class ProgressReader:
    """The latest step each rank reported on ``<job>.progress``."""

    def __init__(self, config: Mapping[str, object], job: str) -> None:
        self.topic = JobTopics(job).progress
        self.reported: dict[int, int] = {}
        self._consumer = RenewingConsumer({**config, "group.id": f"{job}.progress-reader", "enable.auto.commit": False})
        self._consumer.assign([TopicPartition(self.topic, 0, 0)])  # compacted: every rank's latest is there

    def read(self, timeout_s: float) -> None:
        """Take in the reports that arrived, waiting up to ``timeout_s`` for the first."""
        for message in self._consumer.consume(10_000, timeout=timeout_s):
            if error := message.error():
                if error.code() != KafkaError._PARTITION_EOF:
                    log.debug("progress topic %s: %s", self.topic, error)
                continue
            try:
                rank, step = decode_progress(message.value())
            except DecodeError as exc:
                log.warning("ignoring a record at %s offset %d: %s", self.topic, message.offset(), exc)
                continue
            self.reported[rank] = step  # in offset order: the latest wins, a lower one too (a resumed trainer)

    def close(self) -> None:
        self._consumer.close()


class TrainerPacing:
    """Whether a step is close enough ahead of the slowest trainer to be drawn (always, without
    ``max_lead_steps`` N, given as ``lead``, or without a reader of the reports)."""

    def __init__(self, progress: ProgressReader | None, lead: int | None, ranks: int, log_interval_s: float) -> None:
        self.progress = progress
        self.lead = lead
        self.ranks = ranks
        self.log_interval_s = log_interval_s
        self._last_log = 0.0

    def allows(self, step: int) -> bool:
        """Reports are read only when the last ones say no, then this waits up to 0.2 s for news (a trainer
        resumed from an older checkpoint is heard the next time the constructor waits)."""
        lead, progress = self.lead, self.progress
        if lead is None or progress is None:
            return True
        if lead_allows(step, progress.reported, self.ranks, lead):
            return True
        progress.read(0.2)
        if lead_allows(step, progress.reported, self.ranks, lead):
            return True
        if time.monotonic() - self._last_log > self.log_interval_s:
            rank, reached = slowest_rank(progress.reported, self.ranks)
            log.info(
                "step %d waits for the trainers: rank %d holds step %d, and max_lead_steps is %d",
                step,
                rank,
                reached,
                lead,
            )
            self._last_log = time.monotonic()
        return False
