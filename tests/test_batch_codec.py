"""The Arrow IPC batch codec and the packed micro-batch views.

Arrow IPC carries no checksum, so a flipped byte inside a token id or a string can decode to a
different batch; what is guaranteed is that nothing but DecodeError escapes and that a decoded batch
keeps every invariant of ``Batch`` (checked again here from the outside)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from topics.errors import DecodeError
from topics.formats.batch import BATCH_SCHEMA, Batch
from topics.formats.batch_codec import (
    VERSION_KEY,
    batch_key,
    decode_batch,
    decode_batch_message,
    encode_batch,
    encode_batch_buffer,
    encode_end_of_data,
    end_of_data_steps,
)
from topics.formats.packing import IGNORE_INDEX, pack_micro_batches
from topics.formats.sample import Sample

INT32 = np.iinfo(np.int32)
token_arrays = arrays(
    np.int32,
    st.integers(0, 12),
    elements=st.one_of(st.sampled_from([INT32.min, INT32.max, 0]), st.integers(INT32.min, INT32.max)),
)
sample_st = st.builds(
    Sample,
    sample_id=st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    source=st.sampled_from(["web", "code", "книги"]),
    tokens=token_arrays,
)


@st.composite
def batches(draw) -> Batch:
    ranks = draw(st.integers(1, 8))
    groups = draw(st.lists(st.lists(sample_st, max_size=3), min_size=1, max_size=4))
    most = max(sum(s.length for s in group) for group in groups)
    return Batch.from_samples(
        step=draw(st.integers(0, 2**40)),
        rank=draw(st.integers(0, ranks - 1)),
        ranks=ranks,
        capacity=max(most, 1) + draw(st.integers(0, 5)),
        micro_batches=groups,
    )


def assert_invariants(batch: Batch) -> None:
    assert 0 <= batch.rank < batch.ranks
    assert batch.micro_batches >= 1 and batch.capacity >= 1
    micro_batch = batch.micro_batch
    assert np.all(np.diff(micro_batch) >= 0)
    assert np.all((micro_batch >= 0) & (micro_batch < batch.micro_batches))
    assert batch.tokens.dtype == np.int32
    assert batch.offsets[-1] == batch.tokens.size
    assert np.all(batch.micro_batch_tokens() <= batch.capacity)
    assert len(batch.sample_ids) == len(batch.sources) == batch.num_samples


def assert_same(a: Batch, b: Batch) -> None:
    fields = ("step", "rank", "ranks", "micro_batches", "capacity", "sample_ids", "sources")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    np.testing.assert_array_equal(a.micro_batch, b.micro_batch)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.tokens, b.tokens)


@settings(deadline=None, max_examples=100)
@given(batch=batches())
def test_round_trip(batch: Batch) -> None:
    key, value, headers = encode_batch(batch)
    assert key == str(batch.step).encode()
    assert dict(headers)["mixflow.step"] == key
    decoded = decode_batch(value, headers)
    assert_same(decoded, batch)
    assert_same(decode_batch(value), batch)
    assert decoded.records.schema.remove_metadata().equals(BATCH_SCHEMA)
    assert_invariants(decoded)
    buffer_key, buffer, buffer_headers = encode_batch_buffer(batch)  # what the constructor produces
    assert (buffer_key, buffer.to_pybytes(), buffer_headers) == (key, value, headers)
    assert buffer.size == len(value)


@settings(deadline=None, max_examples=15)
@given(batch=batches(), data=st.data())
def test_truncation_is_detected(batch: Batch, data) -> None:
    _, value, headers = encode_batch(batch)
    ends = data.draw(st.lists(st.integers(0, len(value) - 1), min_size=20, max_size=40))
    for end in [*ends, len(value) - 9]:
        try:
            decoded = decode_batch(value[:end], headers)
        except DecodeError:
            continue
        # Only the end-of-stream marker may go missing without notice: the data is all there.
        assert end >= len(value) - 8
        assert_same(decoded, batch)


@settings(deadline=None, max_examples=150)
@given(batch=batches(), data=st.data())
def test_flipped_bytes_raise_decode_error_or_keep_the_invariants(batch: Batch, data) -> None:
    _, value, headers = encode_batch(batch)
    damaged = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(value) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_batch(bytes(damaged), headers)
    except DecodeError:
        return
    assert_invariants(decoded)


@settings(deadline=None, max_examples=150)
@given(value=st.binary(max_size=300))
def test_random_bytes_raise_decode_error(value: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(value, topic="j.rank.0", partition=0, offset=3)


def _encoded() -> tuple[Batch, bytes, bytes, list[tuple[str, bytes]]]:
    groups = [[Sample("web/a/0", "web", np.arange(4, dtype=np.int32))], []]
    batch = Batch.from_samples(step=5, rank=1, ranks=2, capacity=8, micro_batches=groups)
    return batch, *encode_batch(batch)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({VERSION_KEY: b"2"}, "version header mixflow.batch.version is b'2'"),
        ({"mixflow.step": b"6"}, "header mixflow.step is b'6' but the schema metadata says b'5'"),
        ({"mixflow.rank": b"01"}, "header mixflow.rank is b'01'"),
    ],
)
def test_headers_must_agree(change: dict[str, bytes], match: str) -> None:
    _, _, value, headers = _encoded()
    headers = [(k, change.get(k, v)) for k, v in headers]
    with pytest.raises(DecodeError, match=match) as error:
        decode_batch(value, headers, topic="j.rank.1", partition=0, offset=12)
    assert "topic=j.rank.1, partition=0, offset=12" in str(error.value)


def _stream(records: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, records.schema) as writer:
        writer.write_batch(records)
    return sink.getvalue().to_pybytes()


def test_foreign_arrow_streams_are_refused() -> None:
    _, _, value, _ = _encoded()
    foreign = pa.record_batch({"x": pa.array([1, 2])})
    with pytest.raises(DecodeError, match=r"version mixflow\.batch\.version in the schema metadata is missing"):
        decode_batch(_stream(foreign))
    meta = decode_batch(value).records.schema.metadata
    renamed = decode_batch(value).records.rename_columns(["id", "source", "micro_batch", "tokens"])
    with pytest.raises(DecodeError, match="column 'sample_id' is missing"):
        decode_batch(_stream(renamed.replace_schema_metadata(meta)))
    retyped = decode_batch(value).records.set_column(2, "micro_batch", pa.array([0], pa.int64()))
    with pytest.raises(DecodeError, match="column 'micro_batch' has type int64, expected int32"):
        decode_batch(_stream(retyped.replace_schema_metadata(meta)))
    with pytest.raises(DecodeError, match="no value"):
        decode_batch(None)


def test_encode_refuses_broken_invariants() -> None:
    def build(**changes) -> Batch:
        arguments = dict(
            step=1,
            rank=0,
            ranks=1,
            micro_batches=2,
            capacity=4,
            sample_ids=["a", "b"],
            sources=["s", "s"],
            micro_batch=[0, 1],
            offsets=[0, 2, 5],
            tokens=np.arange(5, dtype=np.int32),
        )
        return Batch.from_arrays(**{**arguments, **changes})

    assert build().num_samples == 2
    with pytest.raises(ValueError, match="not ordered by micro_batch"):
        build(micro_batch=[1, 0])
    with pytest.raises(ValueError, match="over capacity 4"):
        build(micro_batch=[1, 1])
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
        build(micro_batch=[0, 2])
    with pytest.raises(ValueError, match="rank 1 is not below ranks 1"):
        build(rank=1)
    with pytest.raises(ValueError, match="offsets must run from 0"):
        build(offsets=[0, 2, 4])
    with pytest.raises(ValueError, match="tokens must be int32"):
        build(tokens=np.arange(5))


def test_decode_a_message_checks_the_key() -> None:
    batch, key, value, headers = _encoded()
    message = Message(topic="j.rank.1", partition=0, offset=7, key=key, value=value, headers=headers)
    assert_same(decode_batch_message(message), batch)
    wrong = Message(topic="j.rank.1", partition=0, offset=8, key=b"4", value=value, headers=headers)
    with pytest.raises(DecodeError, match="key b'4' does not match step 5"):
        decode_batch_message(wrong)
    assert batch_key(0) == b"0"


@settings(deadline=None, max_examples=100)
@given(batch=batches())
def test_packed_micro_batches(batch: Batch) -> None:
    packed = pack_micro_batches(batch)
    assert len(packed) == batch.micro_batches
    rows = batch.samples()
    by_micro_batch = [[s for s, m in zip(rows, batch.micro_batch, strict=True) if m == k] for k in range(len(packed))]
    for micro, group in zip(packed, by_micro_batch, strict=True):
        assert micro.sample_ids == [s.sample_id for s in group]
        expected = np.concatenate([s.tokens for s in group]) if group else np.zeros(0, np.int32)
        np.testing.assert_array_equal(micro.token_ids, expected)
        np.testing.assert_array_equal(micro.cu_seqlens, np.cumsum([0] + [s.length for s in group]))
        positions = [np.arange(s.length) for s in group]
        np.testing.assert_array_equal(micro.position_ids, np.concatenate(positions) if group else [])
        assert micro.cu_seqlens.dtype == micro.position_ids.dtype == micro.token_ids.dtype == np.int32
        # Labels: each sample's own next token, never the first token of the sample after it.
        labels = [np.append(s.tokens[1:].astype(np.int64), IGNORE_INDEX) for s in group if s.length]
        np.testing.assert_array_equal(micro.labels, np.concatenate(labels) if labels else [])
        assert micro.labels.dtype == np.int64
        assert micro.max_seqlen == max((s.length for s in group), default=0)
        assert micro.token_ids.size <= batch.capacity


def test_end_of_data_record() -> None:
    key, value, headers = encode_end_of_data(42)
    assert (key, value) == (b"end", b"")
    assert end_of_data_steps(headers) == 42
    assert end_of_data_steps(encode_batch(_encoded()[0])[2]) is None
    message = Message(topic="j.rank.0", partition=0, offset=9, key=key, value=value, headers=headers)
    with pytest.raises(DecodeError, match="offset=9\\): an end-of-data record, not a batch"):
        decode_batch_message(message)
    with pytest.raises(ValueError, match="not a canonical decimal"):
        end_of_data_steps([("mixflow.end", b"-1")])
