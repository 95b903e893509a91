"""The Arrow IPC codec for batches on ``<job>.rank.<r>``; FORMAT.md describes the bytes.

Value: one Arrow IPC *stream* (schema, dictionary, exactly one record batch, end-of-stream marker),
uncompressed (compress at the Kafka level with ``compression.type``). Key: the step in decimal ASCII.
The same ``mixflow.*`` keys, with decimal ASCII values, are in the schema metadata and in the headers.

What decoding guarantees: any input either raises ``DecodeError`` or gives a ``Batch`` whose
invariants hold (schema, metadata, rows ordered by micro-batch, micro-batches within capacity,
valid Arrow offsets and dictionary indices). A flipped byte inside a token id or a string cannot be
told from the original; Kafka's CRC-32C on every record batch catches corruption in transit.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from topics.errors import DecodeError
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_wire import from_wire, to_wire
from topics.formats.headers import Headers, decimal, find_header, parse_decimal

BATCH_FORMAT_VERSION = 1
"""Bump on any change that a reader of the previous version would misread; see FORMAT.md."""
CP_BATCH_FORMAT_VERSION = 3
"""The batches of a context-parallel job (``CPBatch``): slices and what their labels need (``cp_wire``); see
FORMAT.md. Version 2 carried every slice token's label and position too: readers take both."""
CP_BATCH_FORMAT_VERSIONS = (2, CP_BATCH_FORMAT_VERSION)

VERSION_KEY = "mixflow.batch.version"
STEP_KEY = "mixflow.step"
RANK_KEY = "mixflow.rank"
RANKS_KEY = "mixflow.ranks"
MICRO_BATCHES_KEY = "mixflow.micro_batches"
CAPACITY_KEY = "mixflow.capacity"
SAMPLES_KEY = "mixflow.samples"
PATCHES_KEY = "mixflow.patches_per_micro_batch"
"""The vision-patch budget of a micro-batch; only in batches of a job that sets one."""
MAX_MICRO_BATCHES_KEY = "mixflow.max_micro_batches"
CONTEXT_PARALLEL_KEY = "mixflow.context_parallel"
LOSS_TOKENS_KEY = "mixflow.loss_tokens"
END_KEY = "mixflow.end"
"""Header of the end-of-data record: the number of steps the job wrote, in decimal ASCII."""
END_RECORD_KEY = b"end"

_FIELDS = {
    STEP_KEY: "step",
    RANK_KEY: "rank",
    RANKS_KEY: "ranks",
    MICRO_BATCHES_KEY: "micro_batches",
    CAPACITY_KEY: "capacity",
}
"""Metadata keys and the ``Batch`` attributes they hold."""


_IPC_OPTIONS = pa.ipc.IpcWriteOptions(use_legacy_format=False, metadata_version=pa.ipc.MetadataVersion.V5)
"""What ``new_stream`` uses by default, given once: it would otherwise read two environment variables per batch
(``ARROW_PRE_0_15_IPC_FORMAT``, ``ARROW_PRE_1_0_METADATA_VERSION``) that must not change the format anyway."""


def batch_key(step: int) -> bytes:
    """The Kafka message key of a step's batches: the step in decimal ASCII, ``42`` -> ``b"42"``."""
    return decimal(step)


_CP_FIELDS = _FIELDS | {MAX_MICRO_BATCHES_KEY: "max_micro_batches", LOSS_TOKENS_KEY: "loss_tokens"}
"""A context-parallel batch's decimal metadata keys (``mixflow.micro_batches``: this rank's count this step)."""


def _metadata(batch: Batch | CPBatch) -> dict[str, bytes]:
    cp = isinstance(batch, CPBatch)
    meta = {VERSION_KEY: decimal(CP_BATCH_FORMAT_VERSION if cp else BATCH_FORMAT_VERSION)}
    meta.update({key: decimal(getattr(batch, attr)) for key, attr in (_CP_FIELDS if cp else _FIELDS).items()})
    meta[SAMPLES_KEY] = decimal(batch.num_samples)
    if isinstance(batch, CPBatch):
        meta[CONTEXT_PARALLEL_KEY] = batch.mode.encode()
    elif batch.patches_per_micro_batch is not None:
        meta[PATCHES_KEY] = decimal(batch.patches_per_micro_batch)
    return meta


def encode_batch(batch: Batch | CPBatch) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Encode a batch (a context-parallel one as version 3, ``cp_wire.to_wire``) as ``(key, value, headers)`` for a
    produce call to ``<job>.rank.<rank>``."""
    key, value, headers = encode_batch_buffer(batch)
    return key, value.to_pybytes(), headers


def encode_batch_buffer(batch: Batch | CPBatch) -> tuple[bytes, pa.Buffer, list[tuple[str, bytes]]]:
    """``encode_batch`` with the value in an Arrow buffer of exactly its size, written once (a producer takes it as
    it is): no growing stream and no copy into ``bytes``, which for a media step is its payload twice more."""
    meta = _metadata(batch)
    records = (to_wire(batch) if isinstance(batch, CPBatch) else batch.records).replace_schema_metadata(meta)
    sized = pa.MockOutputStream()  # counts what the stream would write, copying nothing
    _write_stream(sized, records)
    value = pa.allocate_buffer(sized.size())
    _write_stream(pa.FixedSizeBufferWriter(value), records)
    return batch_key(batch.step), value, list(meta.items())


def _write_stream(sink: pa.NativeFile, records: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, records.schema, options=_IPC_OPTIONS) as writer:
        writer.write_batch(records)


def encode_end_of_data(steps: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """The record that closes every rank topic of a job that has ended after ``steps`` steps, as
    ``(key, value, headers)``: key ``end``, an empty value and the header ``mixflow.end``."""
    return END_RECORD_KEY, b"", [(VERSION_KEY, decimal(BATCH_FORMAT_VERSION)), (END_KEY, decimal(steps))]


def end_of_data_steps(headers: Headers) -> int | None:
    """The step count of an end-of-data record's headers; ``None`` for any other record (a batch)."""
    raw = find_header(headers, END_KEY)
    return None if raw is None else parse_decimal(f"header {END_KEY}", raw)


def _read_stream(value: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(value))
    batches = list(reader)
    if len(batches) != 1:
        msg = f"the Arrow stream holds {len(batches)} record batches, expected exactly 1"
        raise ValueError(msg)
    return batches[0]


def decode_batch(
    value: bytes | None,
    headers: Headers = None,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> Batch:
    """Decode a message written by ``encode_batch`` (version 1); raise ``DecodeError`` saying where and why if
    not. A context-parallel batch (version 2 or 3) is refused: ``decode_any_batch`` reads every version.

    With ``headers`` (as ``Message.headers()`` gives them), each ``mixflow.*`` header must agree with
    the schema metadata; with ``None`` the value alone is decoded. Token arrays are views into ``value``.
    """
    batch = decode_any_batch(value, headers, topic=topic, partition=partition, offset=offset, versions=(1,))
    assert isinstance(batch, Batch)
    return batch


def decode_any_batch(
    value: bytes | None,
    headers: Headers = None,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    versions: tuple[int, ...] = (BATCH_FORMAT_VERSION, *CP_BATCH_FORMAT_VERSIONS),
) -> Batch | CPBatch:
    """``decode_batch`` for any of ``versions``: a ``Batch`` (version 1) or a ``CPBatch`` (versions 2 and 3)."""

    def error(reason: str) -> DecodeError:
        return DecodeError(reason, topic=topic, partition=partition, offset=offset)

    known = " and ".join(str(v) for v in versions)
    if value is None:
        raise error("the message has no value")
    try:
        version = find_header(headers, VERSION_KEY)
        if headers is not None and version not in {decimal(v) for v in versions}:
            shown = "missing" if version is None else repr(version[:40])
            raise error(
                f"batch format version header {VERSION_KEY} is {shown}; this reader knows {known}"
                + _cp_hint(version, versions)
            )
        records = _read_stream(value)
    except DecodeError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... on truncated or foreign bytes
        raise error(f"not a readable Arrow IPC stream ({type(exc).__name__}: {exc})") from exc
    try:
        return _to_batch(records, headers, versions)
    except ValueError as exc:
        raise error(str(exc)) from exc


def _cp_hint(version: bytes | None, versions: tuple[int, ...]) -> str:
    if version in {decimal(v) for v in CP_BATCH_FORMAT_VERSIONS} and not set(CP_BATCH_FORMAT_VERSIONS) & set(versions):
        return " (a context-parallel job's batch: each rank's slices; read it with decode_any_batch)"
    return ""


def _to_batch(records: pa.RecordBatch, headers: Headers, versions: tuple[int, ...]) -> Batch | CPBatch:
    meta: dict[bytes, bytes] = records.schema.metadata or {}
    version = meta.get(VERSION_KEY.encode())
    if version not in {decimal(v) for v in versions}:
        shown = "missing" if version is None else repr(version[:40])
        known = " and ".join(str(v) for v in versions)
        msg = f"batch format version {VERSION_KEY} in the schema metadata is {shown}; this reader knows {known}"
        raise ValueError(msg + _cp_hint(version, versions))
    cp = version in {decimal(v) for v in CP_BATCH_FORMAT_VERSIONS}
    fields = _CP_FIELDS if cp else _FIELDS
    values: dict[str, Any] = {}
    for key in (*fields, SAMPLES_KEY):
        raw = meta.get(key.encode())
        values[key] = parse_decimal(f"schema metadata {key}", raw)
        _agree(headers, key, raw)
    if values[SAMPLES_KEY] != records.num_rows:
        msg = f"{SAMPLES_KEY} says {values[SAMPLES_KEY]} rows but the record batch holds {records.num_rows}"
        raise ValueError(msg)
    if cp:
        mode = meta.get(CONTEXT_PARALLEL_KEY.encode())
        _agree(headers, CONTEXT_PARALLEL_KEY, mode)
        if mode is None:
            raise ValueError(f"schema metadata {CONTEXT_PARALLEL_KEY} is missing")
        return CPBatch(
            **{attr: values[key] for key, attr in fields.items()},
            mode=mode.decode("utf-8", "replace"),
            records=from_wire(records) if version == decimal(CP_BATCH_FORMAT_VERSION) else records,
        )
    return Batch(
        **{attr: values[key] for key, attr in fields.items()},
        records=records,
        patches_per_micro_batch=_patch_budget(meta, headers),
    )


def _agree(headers: Headers, key: str, raw: bytes | None) -> None:
    header = find_header(headers, key)
    if headers is not None and header != raw:
        msg = f"header {key} is {header!r} but the schema metadata says {raw!r}"
        raise ValueError(msg)


def _patch_budget(meta: dict[bytes, bytes], headers: Headers) -> int | None:
    raw = meta.get(PATCHES_KEY.encode())
    _agree(headers, PATCHES_KEY, raw)
    return None if raw is None else parse_decimal(f"schema metadata {PATCHES_KEY}", raw)


def decode_batch_message(message: Any) -> Batch:
    """Decode a ``confluent_kafka.Message`` and check its key; errors name topic, partition, offset.

    An end-of-data record is not a batch: check ``end_of_data_steps(message.headers())`` first."""
    batch = decode_any_batch_message(message, versions=(BATCH_FORMAT_VERSION,))
    assert isinstance(batch, Batch)
    return batch


def decode_any_batch_message(
    message: Any, versions: tuple[int, ...] = (BATCH_FORMAT_VERSION, *CP_BATCH_FORMAT_VERSIONS)
) -> Batch | CPBatch:
    """``decode_batch_message`` for any of ``versions`` (a context-parallel job's batches are versions 2 and 3)."""
    where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
    if message.error() is not None:
        msg = f"the consumer returned an error event, not a message: {message.error()}"
        raise DecodeError(msg, **where)
    if find_header(message.headers(), END_KEY) is not None:
        raise DecodeError("an end-of-data record, not a batch", **where)
    batch = decode_any_batch(message.value(), message.headers(), versions=versions, **where)
    key = message.key()
    if key is not None and key != batch_key(batch.step):
        msg = f"message key {key[:40]!r} does not match step {batch.step}"
        raise DecodeError(msg, **where)
    return batch
