"""mixflow.topics: topic names, the sample, batch and dead-letter formats, and topic administration.

This package imports nothing from ``pipeline``, ``connectors`` or ``trainer_sink``."""

from topics.admin import (
    TopicSpec,
    client_config,
    delete_job_topics,
    describe_job_topics,
    ensure_job_topics,
    ensure_topics,
    job_layout,
    topic_exists,
)
from topics.batch import BATCH_SCHEMA, Batch
from topics.batch_codec import BATCH_FORMAT_VERSION, batch_key, decode_batch, decode_batch_message, encode_batch
from topics.dead_letter import DeadLetter, decode_dead_letter, decode_dead_letter_message, encode_dead_letter
from topics.errors import DecodeError, InvalidNameError, MixflowError, TopicLayoutError
from topics.names import (
    MAX_JOB_LENGTH,
    MAX_SOURCE_LENGTH,
    JobTopics,
    TopicKind,
    TopicName,
    parse_topic,
    validate_job_name,
    validate_source_name,
)
from topics.packing import PackedMicroBatch, pack_micro_batches
from topics.sample import Sample
from topics.sample_codec import (
    SAMPLE_FINGERPRINT,
    SAMPLE_SCHEMA,
    SCHEMA_HEADER,
    decode_sample,
    decode_sample_message,
    encode_sample,
)

__all__ = [
    "BATCH_FORMAT_VERSION",
    "BATCH_SCHEMA",
    "MAX_JOB_LENGTH",
    "MAX_SOURCE_LENGTH",
    "SAMPLE_FINGERPRINT",
    "SAMPLE_SCHEMA",
    "SCHEMA_HEADER",
    "Batch",
    "DeadLetter",
    "DecodeError",
    "InvalidNameError",
    "JobTopics",
    "MixflowError",
    "PackedMicroBatch",
    "Sample",
    "TopicKind",
    "TopicLayoutError",
    "TopicName",
    "TopicSpec",
    "batch_key",
    "client_config",
    "decode_batch",
    "decode_batch_message",
    "decode_dead_letter",
    "decode_dead_letter_message",
    "decode_sample",
    "decode_sample_message",
    "delete_job_topics",
    "describe_job_topics",
    "encode_batch",
    "encode_dead_letter",
    "encode_sample",
    "ensure_job_topics",
    "ensure_topics",
    "job_layout",
    "pack_micro_batches",
    "parse_topic",
    "topic_exists",
    "validate_job_name",
    "validate_source_name",
]
