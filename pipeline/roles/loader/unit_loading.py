"""Loading one work unit into the open transaction: read it, tokenize its documents in batches, and
produce its samples to the source topic and its bad records to the dead-letter topic."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from confluent_kafka import Message, Producer

from connectors import Document, WorkUnit
from pipeline.roles.loader.metrics import LoaderMetrics
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.roles.loader.stats import UnitCounts
from pipeline.roles.loader.topic_partitions import partition_count
from topics.errors import DecodeError
from topics.formats.dead_letter import DeadLetter, encode_dead_letter
from topics.formats.lanes import unit_partition
from topics.formats.names import JobTopics
from topics.formats.sample_codec import encode_sample
from topics.kafka.clients import KafkaConfig, produce

log = logging.getLogger(__name__)

# Documents tokenized together: big enough for the tokenizer's parallel batch encoding to pay off.
DOCUMENTS_PER_BATCH = 256


class UnitLoader:
    """Produces what one unit of one source holds, with a producer whose transaction is open."""

    def __init__(self, config: KafkaConfig, topics: JobTopics, runtime: SourceRuntime, metrics: LoaderMetrics) -> None:
        self.config = config
        self.topics = topics
        self.runtime = runtime
        self.source = runtime.spec.name
        self.metrics = metrics
        self._lanes: int | None = None  # partitions of the source topic, read at the first unit

    def load(
        self, producer: Producer, unit: WorkUnit, place: int, items: Iterator[Document | DeadLetter]
    ) -> UnitCounts:
        """Tokenize ``unit``'s ``items`` (what its reader, or the read-ahead, gives); ``place``, its work
        partition plus its offset there, picks the source topic's partition, which spreads a source's units
        over the constructor lanes."""
        samples = tokens = letters = 0
        src_topic = self.topics.src(self.source)
        # Each constructor lane reads one partition: a unit's samples go together, in order, to one of them.
        partition = unit_partition(place, self._src_partitions())
        for documents, bad in batches(items, DOCUMENTS_PER_BATCH):
            built = self.runtime.builder.build(documents, epoch=unit.epoch) if documents else None
            for sample in built.samples if built else ():
                value, headers = encode_sample(sample)
                produce(producer, src_topic, value, key=sample.sample_id.encode(), headers=headers, partition=partition)
                samples += 1
                tokens += sample.length
            letters += self.publish_letters(producer, bad + (built.dead_letters if built else [])).dead_letters
        return UnitCounts(samples, tokens, letters)

    def publish_letters(self, producer: Producer, letters: list[DeadLetter]) -> UnitCounts:
        self.metrics.letters_produced(letters)
        for letter in letters:
            key, value, headers = encode_dead_letter(letter)
            produce(producer, self.topics.dlq, value, key=key, headers=headers)
            log.warning("dead letter from %s at %s: %s", letter.source, letter.location, letter.reason)
        return UnitCounts(dead_letters=len(letters))

    def _src_partitions(self) -> int:
        """The partitions of the source topic: the job's constructor lanes (read once)."""
        if self._lanes is None:
            self._lanes = partition_count(self.config, self.topics.src(self.source))
        return self._lanes


def batches(items: Iterator[Document | DeadLetter], size: int) -> Iterator[tuple[list[Document], list[DeadLetter]]]:
    """The documents of ``items`` in lists of ``size`` (the last may be shorter), each with the dead letters
    met since the previous list."""
    documents: list[Document] = []
    letters: list[DeadLetter] = []
    for item in items:
        (documents if isinstance(item, Document) else letters).append(item)  # type: ignore[arg-type]
        if len(documents) >= size:
            yield documents, letters
            documents, letters = [], []
    if documents or letters:
        yield documents, letters


def decode_unit(message: Message, source: str) -> tuple[WorkUnit | None, list[DeadLetter]]:
    """The unit a work record holds, or None and the dead letter of an undecodable record."""
    try:
        return WorkUnit.from_json(message.value()), []
    except DecodeError as exc:
        reason = f"undecodable work unit: {exc.reason}"
        return None, [DeadLetter(source, where(message), reason, payload=message.value())]


def where(message: Message) -> str:
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"
