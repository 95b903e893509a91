"""The spec in force on a job's control topic: ``spec`` records (``pipeline.planning.step.spec_in_force``).

The constructor writes one when it starts or resumes under a spec whose mixing part differs from the last
one recorded, from the step it resumes at, in a transaction of its own producer before its first step: a
constructor fenced since cannot write one, and a crash leaves it whole or absent. A record written by a
constructor that died before its first step is harmless: the next one to resume at that step either
finds it right or writes its own, which replaces it from there. The constructor's reader of mixture
changes does not count these records in its control offset, so that the state records stay as they
were without them."""

from __future__ import annotations

import logging

from confluent_kafka import Producer, TopicPartition

from pipeline.kafka.control import SPEC_KEY
from pipeline.kafka.role_protocol import TransactionalRole
from pipeline.planning.step.spec_in_force import SpecRecord
from pipeline.spec import JobSpec
from topics.errors import DecodeError, MixflowError
from topics.formats.json_record import decode, encode
from topics.formats.names import JobTopics
from topics.kafka.admin import topic_exists
from topics.kafka.clients import KafkaConfig, produce
from topics.kafka.log_reader import read_to_end

log = logging.getLogger(__name__)

SPEC_KIND = SPEC_KEY.decode()
ATTEMPTS = 5


def encode_spec_record(record: SpecRecord) -> bytes:
    return encode(record, kind=SPEC_KIND)


def read_spec_records(config: KafkaConfig, topics: JobTopics) -> list[SpecRecord]:
    """The job's committed spec records, in the order written (none for a job that wrote its steps before
    they existed). A record that does not decode is skipped as if it were not there, with a warning naming its
    offset: it never stops a constructor from resuming (docs/guarantees.md, "Control records")."""
    if not topic_exists(config, topics.control):
        return []
    out = []
    for message in read_to_end(config, topics.control):
        if message.key() != SPEC_KEY:
            continue
        try:
            out.append(decode(SpecRecord, message.value()))
        except DecodeError as exc:
            log.warning(
                "skipping a broken spec record: %s", exc.at(message.topic(), message.partition(), message.offset())
            )
    return out


def record_spec(role: TransactionalRole, producer: Producer, topics: JobTopics, spec: JobSpec, from_step: int) -> None:
    """Record that the job's steps from ``from_step`` on are written under ``spec``, unless the last record
    says so already, in a transaction of ``role``'s ``producer`` (none may be open). Jobs with several
    constructor lanes record nothing (replay refuses them)."""
    if spec.constructor.lanes > 1:
        return
    record = SpecRecord.of(spec, from_step)
    written = read_spec_records(role.config, topics)
    if written and written[-1].digest == record.digest:
        return
    value = encode_spec_record(record)

    def work() -> list[TopicPartition]:
        produce(producer, topics.control, value, key=SPEC_KEY)
        return []

    what = f"the spec record of job {topics.job} from step {from_step}"
    for _ in range(ATTEMPTS):
        if role.transaction(producer, None, work, what):
            log.info("job %s: spec %s recorded from step %d", topics.job, record.digest, from_step)
            return
    msg = f"{what} was aborted {ATTEMPTS} times"
    raise MixflowError(msg)
