"""mixflow.topics: topic names, the sample, batch and dead-letter formats, and topic administration.

This package imports nothing from ``pipeline``, ``connectors`` or ``trainer_sink``."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "admin": [
            "TopicSpec",
            "client_config",
            "delete_job_topics",
            "describe_job_topics",
            "ensure_job_topics",
            "ensure_topics",
            "job_layout",
            "topic_exists",
        ],
        "batch": ["BATCH_SCHEMA", "MEDIA_BATCH_SCHEMA", "Batch"],
        "batch_codec": ["BATCH_FORMAT_VERSION", "batch_key", "decode_batch", "decode_batch_message", "encode_batch"],
        "dead_letter": ["DeadLetter", "decode_dead_letter", "decode_dead_letter_message", "encode_dead_letter"],
        "errors": ["DecodeError", "InvalidNameError", "MixflowError", "TopicLayoutError"],
        "names": [
            "MAX_JOB_LENGTH",
            "MAX_SOURCE_LENGTH",
            "JobTopics",
            "TopicKind",
            "TopicName",
            "parse_topic",
            "validate_job_name",
            "validate_source_name",
        ],
        "media_packing": ["PackedMedia", "PixelOptions", "pack_media"],
        "packing": ["PackedMicroBatch", "pack_micro_batches"],
        "sample": ["Sample"],
        "sample_codec": [
            "SAMPLE_FINGERPRINT",
            "SAMPLE_SCHEMA",
            "SCHEMA_HEADER",
            "decode_sample",
            "decode_sample_message",
            "encode_sample",
        ],
    },
)
