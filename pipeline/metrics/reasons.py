"""A dead letter's ``reason`` is free text for humans (it names fields, bytes, exceptions); as a metric
label it would grow without bound. ``reason_class`` maps it onto a fixed set of classes. Pure."""

from __future__ import annotations

import re
from enum import StrEnum


class DeadLetterReason(StrEnum):
    UNREADABLE_FILE = "unreadable_file"
    TRUNCATED_FILE = "truncated_file"
    NOT_UTF8 = "not_utf8"
    INVALID_JSON = "invalid_json"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    BAD_TOKENS = "bad_tokens"
    EMPTY_DOCUMENT = "empty_document"
    BAD_WORK_UNIT = "bad_work_unit"
    UNDECODABLE_SAMPLE = "undecodable_sample"
    OTHER = "other"


# First match wins; the patterns follow the reasons the readers in connectors/ and the roles write.
_PATTERNS: tuple[tuple[re.Pattern[str], DeadLetterReason], ...] = tuple(
    (re.compile(pattern), reason)
    for pattern, reason in (
        (r"^undecodable work unit", DeadLetterReason.BAD_WORK_UNIT),
        (r"^cannot (read|open)", DeadLetterReason.UNREADABLE_FILE),
        (r"^(file ends at row|file has \d+ rows, fewer|row group \d+ planned)", DeadLetterReason.TRUNCATED_FILE),
        (r"^not UTF-8", DeadLetterReason.NOT_UTF8),
        (r"^(invalid JSON|line is a JSON)", DeadLetterReason.INVALID_JSON),
        (r"(is missing or null|^no column)", DeadLetterReason.MISSING_FIELD),
        (r"(, not a string|has type .*, expected)", DeadLetterReason.WRONG_TYPE),
        (r"(token ids|^token|not a flat list)", DeadLetterReason.BAD_TOKENS),
        (r"^document has no tokens", DeadLetterReason.EMPTY_DOCUMENT),
    )
)


def reason_class(reason: str) -> DeadLetterReason:
    """The class of a dead letter's reason; ``OTHER`` for a reason no pattern knows."""
    for pattern, cls in _PATTERNS:
        if pattern.search(reason):
            return cls
    return DeadLetterReason.OTHER
