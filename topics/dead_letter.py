"""A record that could not be turned into samples, with where it came from and why, and its codec for
``<job>.dlq`` (JSON; FORMAT.md describes it)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from topics._headers import Headers, find_header
from topics.errors import DecodeError

DEAD_LETTER_VERSION = 1
"""Bump on any change that a reader of the previous version would misread."""
DLQ_SOURCE_HEADER = "mixflow.source"
DLQ_VERSION_HEADER = "mixflow.dlq.version"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """``location`` names the place precisely enough to find it again: a file and row, a row group,
    or a topic, partition and offset. ``payload`` holds the raw bytes when there are any worth keeping.
    ``error_type`` is the qualified name of the exception that rejected the record, if one did."""

    source: str
    location: str
    reason: str
    payload: bytes | None = None
    error_type: str | None = None

    @classmethod
    def from_exception(cls, source: str, location: str, exc: BaseException, payload: bytes | None = None) -> DeadLetter:
        """A dead letter whose reason is ``str(exc)`` (or its type when the message is empty)."""
        error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
        return cls(source, location, str(exc) or type(exc).__qualname__, payload, error_type)


def _source_bytes(source: str) -> bytes:
    # surrogatepass: a source name read from a file system may hold lone surrogates.
    return source.encode("utf-8", "surrogatepass")


def encode_dead_letter(letter: DeadLetter) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Encode as ``(key, value, headers)`` for a produce call to ``<job>.dlq``; the key is the source."""
    for name in ("source", "location", "reason"):
        if not isinstance(getattr(letter, name), str):
            msg = f"dead letter {name} must be a string, not {getattr(letter, name)!r}"
            raise ValueError(msg)
    if letter.payload is not None and not isinstance(letter.payload, bytes | bytearray | memoryview):
        msg = f"dead letter payload must be bytes or None, not {type(letter.payload).__name__}"
        raise ValueError(msg)
    document = {
        "version": DEAD_LETTER_VERSION,
        "source": letter.source,
        "location": letter.location,
        "reason": letter.reason,
        "error_type": letter.error_type,
        "payload": None if letter.payload is None else base64.b64encode(bytes(letter.payload)).decode(),
    }
    # ensure_ascii: the value is plain ASCII, and strings with lone surrogates survive the round trip.
    value = json.dumps(document, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    source = _source_bytes(letter.source)
    return source, value, [(DLQ_VERSION_HEADER, b"1"), (DLQ_SOURCE_HEADER, source)]


def _field(document: dict[str, Any], name: str, *, optional: bool = False) -> Any:
    value = document.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        msg = f"field {name!r} must be a string{' or null' if optional else ''}, not {value!r:.60}"
        raise ValueError(msg)
    return value


def decode_dead_letter(
    value: bytes | None,
    headers: Headers = None,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    """Decode a record written by ``encode_dead_letter``; raise ``DecodeError`` saying where and why.

    Unknown fields are ignored, so later writers may add fields without a version bump."""

    def error(reason: str) -> DecodeError:
        return DecodeError(reason, topic=topic, partition=partition, offset=offset)

    if value is None:
        raise error("the record has no value")
    try:
        document = json.loads(bytes(value).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(f"dead letter value is not UTF-8 JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise error(f"dead letter value is a JSON {type(document).__name__}, not an object")
    version = document.get("version")
    if type(version) is not int or version != DEAD_LETTER_VERSION:
        raise error(f"dead letter version is {version!r:.40}; this reader knows {DEAD_LETTER_VERSION}")
    try:
        payload_text = _field(document, "payload", optional=True)
        payload = None if payload_text is None else base64.b64decode(payload_text, validate=True)
        letter = DeadLetter(
            source=_field(document, "source"),
            location=_field(document, "location"),
            reason=_field(document, "reason"),
            payload=payload,
            error_type=_field(document, "error_type", optional=True),
        )
        header = find_header(headers, DLQ_SOURCE_HEADER)
    except ValueError as exc:  # binascii.Error is a ValueError
        raise error(f"bad dead letter: {exc}") from exc
    if header is not None and header != _source_bytes(letter.source):
        raise error(f"header {DLQ_SOURCE_HEADER} {header[:60]!r} differs from the value's source")
    return letter


def decode_dead_letter_message(message: Any) -> DeadLetter:
    """Decode a ``confluent_kafka.Message`` from ``<job>.dlq``; errors name topic, partition, offset."""
    where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
    if message.error() is not None:
        msg = f"the consumer returned an error event, not a record: {message.error()}"
        raise DecodeError(msg, **where)
    return decode_dead_letter(message.value(), message.headers(), **where)
