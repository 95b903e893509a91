"""A record that could not be turned into samples, with where it came from and why, and its codec for
``<job>.dlq`` (JSON; FORMAT.md describes it)."""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from topics._headers import Headers, find_header
from topics.errors import DecodeError
from topics.validation import describe_errors

if TYPE_CHECKING:
    from pydantic import TypeAdapter

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


@dataclass(frozen=True, slots=True)
class DeadLetterDocument:
    """The JSON value on ``<job>.dlq`` (FORMAT.md), field for field in the order it is written.

    ``decode_dead_letter`` checks ``version`` first, then validates the rest against this with pydantic
    (strings; the last two may be null or absent) and ignores fields it does not know."""

    version: int
    source: str
    location: str
    reason: str
    error_type: str | None = None
    payload: str | None = None
    """The raw bytes in base64 (RFC 4648, with padding)."""


@functools.cache
def _document_validator() -> TypeAdapter[DeadLetterDocument]:
    """Built at the first decode: the trainer sink imports ``topics`` and has no use for pydantic."""
    from pydantic import TypeAdapter

    return TypeAdapter(DeadLetterDocument)


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
    document = DeadLetterDocument(
        version=DEAD_LETTER_VERSION,
        source=letter.source,
        location=letter.location,
        reason=letter.reason,
        error_type=letter.error_type,
        payload=None if letter.payload is None else base64.b64encode(bytes(letter.payload)).decode(),
    )
    # ensure_ascii: the value is plain ASCII, and strings with lone surrogates survive the round trip.
    value = json.dumps(asdict(document), ensure_ascii=True, separators=(",", ":")).encode("ascii")
    source = _source_bytes(letter.source)
    return source, value, [(DLQ_VERSION_HEADER, b"1"), (DLQ_SOURCE_HEADER, source)]


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
    from pydantic import ValidationError

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
        fields = _document_validator().validate_python(document)
    except ValidationError as exc:
        raise error(f"bad dead letter: {describe_errors(exc, DeadLetterDocument)}") from exc
    try:
        payload = None if fields.payload is None else base64.b64decode(fields.payload, validate=True)
    except ValueError as exc:  # binascii.Error is a ValueError
        raise error(f"bad dead letter: field 'payload' is not base64: {exc}") from exc
    letter = DeadLetter(fields.source, fields.location, fields.reason, payload, fields.error_type)
    try:
        header = find_header(headers, DLQ_SOURCE_HEADER)
    except ValueError as exc:
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
