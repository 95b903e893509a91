"""A record that could not be turned into samples, with where it came from and why, and its codec for
``<job>.dlq`` (JSON; FORMAT.md describes it)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Annotated, Any

from topics.errors import DecodeError
from topics.formats.headers import Headers, find_header
from topics.formats.json_record import encode, json_field, json_record, validate

DEAD_LETTER_VERSION = 1
"""Bump on any change that a reader of the previous version would misread."""
DLQ_SOURCE_HEADER = "mixflow.source"
DLQ_VERSION_HEADER = "mixflow.dlq.version"


class _Base64:
    """A ``bytes`` field written as base64 (RFC 4648, with padding)."""

    @staticmethod
    def encode(payload: bytes | None) -> str | None:
        return None if payload is None else base64.b64encode(bytes(payload)).decode()

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(_from_base64, core_schema.str_schema())


def _from_base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:  # binascii.Error is a ValueError
        msg = f"not base64: {exc}"
        raise ValueError(msg) from exc


@json_record(
    "dead letter",
    version=DEAD_LETTER_VERSION,
    version_key="version",
    order=("source", "location", "reason", "error_type", "payload", "records", "unit"),
)
@dataclass(frozen=True, slots=True)
class DeadLetter:
    """``location`` names the place precisely enough to find it again: a file and row, a row group,
    or a topic, partition and offset. ``payload`` holds the raw bytes when there are any worth keeping.
    ``error_type`` is the qualified name of the exception that rejected the record, if one did.

    A letter for more than one record counts them in ``records``: a column of the wrong type, or a work unit (or
    the rest of one) that could not be read, such as a file that does not open or an object changed since
    planning; such a letter names the ``unit`` (its id) as well, and has ``unit`` without ``records`` when the
    plan did not count the unit's rows (a small object planned from its listing, a file that could not be
    inspected). A letter for one record has neither.

    The JSON value on ``<job>.dlq`` (FORMAT.md, ``topics.formats.json_record``) is ``{"version":1,"source":...,
    "location":...,"reason":...,"error_type":...,"payload":<base64>,"records":...,"unit":...}``: strings but
    ``records``, a number; ``error_type`` and ``payload`` may be null or absent, ``records`` and ``unit`` are
    absent for a letter of one record; fields it does not know are ignored."""

    source: str
    location: str
    reason: str
    payload: Annotated[bytes, _Base64()] | None = json_field(encode=_Base64.encode, default=None)
    error_type: str | None = None
    records: int | None = json_field(omit_default=True, default=None)
    unit: str | None = json_field(omit_default=True, default=None)

    def __post_init__(self) -> None:
        if self.records is not None and (type(self.records) is not int or self.records < 1):
            msg = f"a dead letter's records must be an integer of at least 1, not {self.records!r:.40}"
            raise ValueError(msg)

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
    # ASCII: strings with lone surrogates survive the round trip.
    source = _source_bytes(letter.source)
    return source, encode(letter), [(DLQ_VERSION_HEADER, b"1"), (DLQ_SOURCE_HEADER, source)]


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
        letter = validate(DeadLetter, document)
    except DecodeError as exc:
        raise error(exc.reason) from exc
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
