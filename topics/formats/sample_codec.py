"""The Avro codec for samples on ``<job>.src.<source>``; the format is written down in FORMAT.md.

The value is one Avro record (``sample.avsc``) in Avro's binary encoding with no framing; the header
``mixflow.schema`` holds the 8-byte CRC-64-AVRO fingerprint of the writer schema (little-endian, as in
Avro's single-object encoding). A reader decodes only records written under a schema it knows.

What decoding guarantees: any input either raises ``DecodeError`` or gives a well-formed ``Sample``
(string id and source, a 1-D int32 token array whose length equals the record's ``length`` field, a
``dict[str, str]`` of metadata) that used every byte of the value. It cannot tell a flipped byte
inside a token or a string from the original: Avro carries no checksum. Kafka's CRC-32C on every
record batch is what catches corruption in transit.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from importlib import resources
from typing import Any, cast

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from topics.errors import DecodeError
from topics.formats.headers import Headers, find_header
from topics.formats.loss_spans import LOSS_SPANS_KEY, parse_loss_spans
from topics.formats.media import INT_FIELDS, MediaItem
from topics.formats.sample import Sample
from topics.formats.sample_wire import read_sample

SCHEMA_HEADER = "mixflow.schema"
"""Kafka header holding the writer schema's 8-byte CRC-64-AVRO fingerprint."""

_INT32_MIN, _INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def _load_schema(name: str) -> tuple[dict[str, Any], bytes]:
    text = resources.files("topics.formats").joinpath(name).read_text(encoding="utf-8")
    parsed = cast(dict[str, Any], parse_schema(json.loads(text)))  # a record schema parses to a dict
    # fastavro gives the fingerprint's bytes in little-endian order, as Avro's Java implementation does.
    return parsed, bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


SAMPLE_SCHEMA, SAMPLE_FINGERPRINT = _load_schema("sample.avsc")
"""The writer schema of a sample without media (parsed) and its 8-byte fingerprint."""

MEDIA_SAMPLE_SCHEMA, MEDIA_SAMPLE_FINGERPRINT = _load_schema("sample_media.avsc")
"""The writer schema of a sample with media: ``sample.avsc`` and a ``media`` array (default empty)."""

_KNOWN_SCHEMAS: dict[bytes, dict[str, Any]] = {
    SAMPLE_FINGERPRINT: SAMPLE_SCHEMA,
    MEDIA_SAMPLE_FINGERPRINT: MEDIA_SAMPLE_SCHEMA,
}
"""Writer schemas this reader can decode, by fingerprint. Keep old ones here when the schema evolves.
Every record is read into ``MEDIA_SAMPLE_SCHEMA`` by Avro's schema resolution (no media: ``media == []``)."""

_MEDIA_FIELDS = ("kind", *INT_FIELDS, "encoding")


def _tokens_bytes(sample: Sample) -> tuple[bytes, int]:
    tokens = np.asarray(sample.tokens)
    if tokens.ndim != 1:
        msg = f"sample {sample.sample_id!r}: tokens must be one-dimensional, got shape {tokens.shape}"
        raise ValueError(msg)
    if tokens.dtype != np.int32:
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            msg = f"sample {sample.sample_id!r}: tokens must be integers, got dtype {tokens.dtype}"
            raise ValueError(msg)
        if tokens.size and (tokens.min() < _INT32_MIN or tokens.max() > _INT32_MAX):
            msg = f"sample {sample.sample_id!r}: token ids must fit in int32"
            raise ValueError(msg)
    # '<i4' is little-endian int32: a no-op view on little-endian machines.
    return np.ascontiguousarray(tokens, dtype="<i4").tobytes(), int(tokens.shape[0])


def _check_strings(sample: Sample) -> None:
    if not isinstance(sample.sample_id, str) or not isinstance(sample.source, str):
        msg = f"sample_id and source must be strings, got {sample.sample_id!r} and {sample.source!r}"
        raise ValueError(msg)
    for key, value in sample.metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            msg = f"sample {sample.sample_id!r}: metadata must map str to str, got {key!r}: {value!r}"
            raise ValueError(msg)
    if LOSS_SPANS_KEY in sample.metadata:
        try:
            parse_loss_spans(sample.metadata[LOSS_SPANS_KEY], sample.length)
        except ValueError as exc:
            msg = f"sample {sample.sample_id!r}: {exc}"
            raise ValueError(msg) from exc


def _check_media(sample: Sample, length: int) -> None:
    for k, item in enumerate(sample.media):
        try:
            item.check()
        except ValueError as exc:
            msg = f"sample {sample.sample_id!r}: media item {k}: {exc}"
            raise ValueError(msg) from exc
        if item.token_offset + item.tokens > length:
            msg = f"sample {sample.sample_id!r}: media item {k}'s placeholders run past its {length} tokens"
            raise ValueError(msg)


def encode_sample(sample: Sample) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Encode a sample as ``(value, headers)`` for a produce call. Raises ``ValueError`` on a bad sample.

    A sample without media is written under ``sample.avsc``, one with media under ``sample_media.avsc``."""
    _check_strings(sample)
    token_bytes, length = _tokens_bytes(sample)
    record: dict[str, Any] = {
        "id": sample.sample_id,
        "source": sample.source,
        "tokens": token_bytes,
        "length": length,
        "metadata": dict(sample.metadata) or None,
    }
    schema, fp = SAMPLE_SCHEMA, SAMPLE_FINGERPRINT
    if sample.media:
        _check_media(sample, length)
        record["media"] = [{name: getattr(item, name) for name in (*_MEDIA_FIELDS, "frames")} for item in sample.media]
        schema, fp = MEDIA_SAMPLE_SCHEMA, MEDIA_SAMPLE_FINGERPRINT
    out = io.BytesIO()
    schemaless_writer(out, schema, record)
    return out.getvalue(), [(SCHEMA_HEADER, fp)]


def decode_sample(
    value: bytes | None,
    headers: Headers,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> Sample:
    """Decode a record written by ``encode_sample``; raise ``DecodeError`` saying where and why if not.

    The returned ``tokens`` is a read-only int32 view into the record's bytes (no copy)."""

    def error(reason: str) -> DecodeError:
        return DecodeError(reason, topic=topic, partition=partition, offset=offset)

    if value is None:
        raise error("the record has no value")
    if (sample := _read_fast(value, headers)) is not None:
        return sample
    try:
        fp = find_header(headers, SCHEMA_HEADER)
    except ValueError as exc:
        raise error(str(exc)) from exc
    if fp is None:
        raise error(f"no {SCHEMA_HEADER} header: not a mixflow sample record")
    schema = _KNOWN_SCHEMAS.get(fp)
    if schema is None:
        known = ", ".join(k.hex() for k in _KNOWN_SCHEMAS)
        raise error(f"written under unknown schema fingerprint {fp.hex()}; this reader knows {known}")
    stream = io.BytesIO(value)
    try:
        record = cast(dict[str, Any], schemaless_reader(stream, schema, MEDIA_SAMPLE_SCHEMA))  # a record
    except Exception as exc:  # fastavro raises EOFError, UnicodeDecodeError, IndexError, ... on bad input
        raise error(f"truncated or corrupt Avro record ({type(exc).__name__}: {exc})") from exc
    if stream.tell() != len(value):
        raise error(f"{len(value) - stream.tell()} trailing bytes after the Avro record")
    return _to_sample(record, error)


_FAST_HEADERS = (
    ([(SCHEMA_HEADER, SAMPLE_FINGERPRINT)], False),
    ([(SCHEMA_HEADER, MEDIA_SAMPLE_FINGERPRINT)], True),
)
"""The headers ``encode_sample`` writes, as ``Message.headers()`` returns them, and whether that schema has media."""


def _read_fast(value: bytes, headers: Headers) -> Sample | None:
    """The sample as ``sample_wire.read_sample`` reads it, where the headers name a current schema."""
    for fast_headers, with_media in _FAST_HEADERS:
        if headers == fast_headers:
            return read_sample(value, with_media=with_media)
    return None


def _to_sample(record: dict[str, Any], error: Callable[[str], DecodeError]) -> Sample:
    token_bytes: bytes = record["tokens"]
    if len(token_bytes) % 4:
        raise error(f"tokens field holds {len(token_bytes)} bytes, not a multiple of 4")
    length = len(token_bytes) // 4
    if record["length"] != length:
        raise error(f"length field says {record['length']} tokens but tokens holds {length}")
    tokens = np.frombuffer(token_bytes, dtype="<i4").astype(np.int32, copy=False)
    media = tuple(_to_media_item(k, item, length, error) for k, item in enumerate(record["media"]))
    metadata = dict(record["metadata"] or {})
    if LOSS_SPANS_KEY in metadata:
        try:
            parse_loss_spans(metadata[LOSS_SPANS_KEY], length)
        except ValueError as exc:
            raise error(str(exc)) from exc
    return Sample(record["id"], record["source"], tokens, metadata, media)


def _to_media_item(k: int, record: dict[str, Any], length: int, error: Callable[[str], DecodeError]) -> MediaItem:
    item = MediaItem(**{name: record[name] for name in _MEDIA_FIELDS}, frames=tuple(record["frames"]))
    try:
        item.check()
    except ValueError as exc:
        raise error(f"media item {k}: {exc}") from exc
    if item.token_offset + item.tokens > length:
        raise error(f"media item {k}'s placeholders run past the sample's {length} tokens")
    return item


def decode_sample_message(message: Any) -> Sample:
    """Decode a ``confluent_kafka.Message``; errors name its topic, partition and offset."""
    if message.error() is None:
        value = message.value()
        if value is not None and (sample := _read_fast(value, message.headers())) is not None:
            return sample
    where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
    if message.error() is not None:
        msg = f"the consumer returned an error event, not a record: {message.error()}"
        raise DecodeError(msg, **where)
    return decode_sample(message.value(), message.headers(), **where)
