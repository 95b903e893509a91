"""The Avro sample codec: round trips, and every damaged input gives DecodeError or a valid Sample.

Avro carries no checksum, so a flipped byte inside a token id or a string can decode to a different
but well-formed sample; what is guaranteed is that nothing but DecodeError escapes, that a decoded
sample is well-formed and used every byte, and that truncation is always detected."""

from __future__ import annotations

import io

import numpy as np
import pytest
from confluent_kafka import Message
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from topics.errors import DecodeError
from topics.formats.sample import Sample
from topics.formats.sample_codec import (
    SAMPLE_FINGERPRINT,
    SAMPLE_SCHEMA,
    SCHEMA_HEADER,
    decode_sample,
    decode_sample_message,
    encode_sample,
)

INT32 = np.iinfo(np.int32)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
token_arrays = arrays(
    np.int32,
    st.integers(0, 64),
    elements=st.one_of(st.sampled_from([INT32.min, INT32.max, 0, -1]), st.integers(INT32.min, INT32.max)),
)
samples = st.builds(
    Sample,
    sample_id=texts,
    source=texts,
    tokens=token_arrays,
    metadata=st.dictionaries(texts, texts, max_size=4),
)


def assert_well_formed(sample: Sample) -> None:
    assert isinstance(sample.sample_id, str)
    assert isinstance(sample.source, str)
    assert sample.tokens.dtype == np.int32
    assert sample.tokens.ndim == 1
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in sample.metadata.items())


def assert_same(a: Sample, b: Sample) -> None:
    assert (a.sample_id, a.source, a.metadata) == (b.sample_id, b.source, b.metadata)
    assert a.tokens.dtype == b.tokens.dtype == np.int32
    np.testing.assert_array_equal(a.tokens, b.tokens)


@settings(deadline=None, max_examples=150)
@given(sample=samples)
def test_round_trip(sample: Sample) -> None:
    value, headers = encode_sample(sample)
    assert headers == [(SCHEMA_HEADER, SAMPLE_FINGERPRINT)]
    assert len(SAMPLE_FINGERPRINT) == 8
    assert_same(decode_sample(value, headers), sample)


def test_long_sample_and_other_integer_dtypes() -> None:
    tokens = np.arange(-500_000, 500_000, dtype=np.int64)
    sample = Sample("web/f.txt/0#3", "web", tokens)
    value, headers = encode_sample(sample)
    assert len(value) > 4 * tokens.size
    decoded = decode_sample(value, headers)
    np.testing.assert_array_equal(decoded.tokens, tokens)
    assert decoded.length == tokens.size


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        (np.array([INT32.max + 1]), "fit in int32"),
        (np.array([1.5]), "integers"),
        (np.zeros((2, 2), np.int32), "one-dimensional"),
    ],
)
def test_encode_refuses_bad_tokens(tokens: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_sample(Sample("s/x/0", "s", tokens))


def test_encode_refuses_bad_strings() -> None:
    with pytest.raises(ValueError, match="metadata"):
        encode_sample(Sample("s/x/0", "s", np.zeros(1, np.int32), {"k": 1}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_sample(Sample("s/\udcff/0", "s", np.zeros(1, np.int32)))  # a lone surrogate has no UTF-8


@settings(deadline=None, max_examples=40)
@given(sample=samples)
def test_every_truncation_is_detected(sample: Sample) -> None:
    value, headers = encode_sample(sample)
    for end in range(len(value)):
        with pytest.raises(DecodeError, match="truncated or corrupt"):
            decode_sample(value[:end], headers)


@settings(deadline=None, max_examples=150)
@given(sample=samples, data=st.data())
def test_flipped_bytes_raise_decode_error_or_give_a_well_formed_sample(sample: Sample, data) -> None:
    value, headers = encode_sample(sample)
    damaged = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(value) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_sample(bytes(damaged), headers)
    except DecodeError:
        return
    assert_well_formed(decoded)


@settings(deadline=None, max_examples=200)
@given(value=st.binary(max_size=200))
def test_random_bytes_raise_decode_error_or_give_a_well_formed_sample(value: bytes) -> None:
    try:
        decoded = decode_sample(value, [(SCHEMA_HEADER, SAMPLE_FINGERPRINT)])
    except DecodeError:
        return
    assert_well_formed(decoded)


@settings(deadline=None, max_examples=50)
@given(fingerprint=st.binary(min_size=0, max_size=12).filter(lambda b: b != SAMPLE_FINGERPRINT))
def test_foreign_fingerprint_is_refused(fingerprint: bytes) -> None:
    value, _ = encode_sample(Sample("s/x/0", "s", np.arange(3, dtype=np.int32)))
    with pytest.raises(DecodeError, match="unknown schema fingerprint") as error:
        decode_sample(value, [(SCHEMA_HEADER, fingerprint)], topic="j.src.s", partition=0, offset=17)
    assert (error.value.topic, error.value.partition, error.value.offset) == ("j.src.s", 0, 17)
    assert "topic=j.src.s, partition=0, offset=17" in str(error.value)


@pytest.mark.parametrize("headers", [None, [], [("other", b"x")]])
def test_missing_fingerprint_is_refused(headers) -> None:
    value, _ = encode_sample(Sample("s/x/0", "s", np.arange(3, dtype=np.int32)))
    with pytest.raises(DecodeError, match=f"no {SCHEMA_HEADER} header"):
        decode_sample(value, headers)


def _raw(record: dict) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, SAMPLE_SCHEMA, record)
    return out.getvalue()


@pytest.mark.parametrize(
    ("record", "extra", "match"),
    [
        ({"tokens": b"\x01\x00\x00\x00\x02", "length": 1}, b"", "not a multiple of 4"),
        ({"tokens": b"\x01\x00\x00\x00", "length": 2}, b"", "length field says 2 tokens but tokens holds 1"),
        ({"tokens": b"\x01\x00\x00\x00", "length": 1}, b"\x00", "1 trailing bytes"),
    ],
)
def test_inconsistent_records_are_refused(record: dict, extra: bytes, match: str) -> None:
    value = _raw({"id": "s/x/0", "source": "s", "metadata": None, **record}) + extra
    with pytest.raises(DecodeError, match=match) as error:
        decode_sample(value, {SCHEMA_HEADER: SAMPLE_FINGERPRINT}, topic="t", partition=2, offset=9)
    assert "topic=t, partition=2, offset=9" in str(error.value)


def test_decode_a_message() -> None:
    sample = Sample("s/x/0", "s", np.arange(5, dtype=np.int32), {"lang": "en"})
    value, headers = encode_sample(sample)
    message = Message(topic="j.src.s", partition=0, offset=4, value=value, headers=headers)
    assert_same(decode_sample_message(message), sample)
    bad = Message(topic="j.src.s", partition=0, offset=5, value=value[:-1], headers=headers)
    with pytest.raises(DecodeError, match=r"topic=j\.src\.s, partition=0, offset=5"):
        decode_sample_message(bad)
    with pytest.raises(DecodeError, match="no value"):
        decode_sample_message(Message(topic="j.src.s", partition=0, offset=6, value=None, headers=headers))
