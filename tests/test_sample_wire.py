"""The wire-level sample reader against fastavro's: the same sample wherever it answers, frames as views of the
record (no copy), and None (the general reader decides) for what fastavro would refuse."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from fastavro import schemaless_reader
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.media_strategies import media_samples
from topics.formats.loss_spans import LOSS_SPANS_KEY
from topics.formats.sample import Sample
from topics.formats.sample_codec import MEDIA_SAMPLE_SCHEMA, SAMPLE_SCHEMA, encode_sample
from topics.formats.sample_wire import read_sample

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def text_samples(draw: st.DrawFn) -> Sample:
    tokens = np.array(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)), np.int32)
    metadata = draw(st.dictionaries(texts, texts, max_size=3))
    if draw(st.booleans()) and tokens.size:
        stop = draw(st.integers(1, tokens.size))
        metadata[LOSS_SPANS_KEY] = f"{draw(st.integers(0, stop - 1))}:{stop}"
    return Sample(draw(texts), draw(texts), tokens, metadata)


def fastavro_record(value: bytes, with_media: bool) -> dict[str, Any] | None:
    """What fastavro reads from ``value`` (None where it refuses it or leaves bytes unread)."""
    stream = io.BytesIO(value)
    schema = MEDIA_SAMPLE_SCHEMA if with_media else SAMPLE_SCHEMA
    try:
        record = schemaless_reader(stream, schema, MEDIA_SAMPLE_SCHEMA)
    except Exception:
        return None
    return record if stream.tell() == len(value) else None  # type: ignore[return-value]


def assert_reads_as(sample: Sample, record: dict[str, Any]) -> None:
    expected = (record["id"], record["source"], record["metadata"] or {})
    assert (sample.sample_id, sample.source, sample.metadata) == expected
    assert sample.tokens.tobytes() == record["tokens"] and sample.length == record["length"]
    assert len(sample.media) == len(record["media"])
    for item, expected in zip(sample.media, record["media"], strict=True):
        assert {name: getattr(item, name) for name in expected if name != "frames"} == {
            name: value for name, value in expected.items() if name != "frames"
        }
        assert [bytes(frame) for frame in item.frames] == expected["frames"]


@settings(deadline=None, max_examples=150)
@given(st.one_of(text_samples(), media_samples()))
def test_reads_what_it_wrote_with_frames_as_views_of_the_record(sample: Sample) -> None:
    value, _ = encode_sample(sample)
    read = read_sample(value, with_media=bool(sample.media))
    assert read is not None
    assert_reads_as(read, fastavro_record(value, bool(sample.media)))  # type: ignore[arg-type]
    assert read.media == sample.media
    for item in read.media:
        assert all(isinstance(frame, memoryview) and frame.obj is value for frame in item.frames)


@settings(deadline=None, max_examples=200)
@given(st.one_of(text_samples(), media_samples()), st.data())
def test_a_damaged_record_reads_as_fastavro_reads_it_or_is_left_to_it(sample: Sample, data: st.DataObject) -> None:
    value, _ = encode_sample(sample)
    damaged = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(value) - 1))] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(value)))
    for candidate in (bytes(damaged), value[:cut], value + data.draw(st.binary(min_size=1, max_size=3))):
        read = read_sample(candidate, with_media=bool(sample.media))
        if read is not None:
            record = fastavro_record(candidate, bool(sample.media))
            assert record is not None, "the fast reader took a record fastavro refuses"
            assert_reads_as(read, record)


def _zigzag(n: int) -> bytes:
    raw, out = (n << 1) ^ (n >> 63), bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes([*out, raw])


@settings(deadline=None, max_examples=50)
@given(media_samples().filter(lambda s: len(s.media) > 1))
def test_arrays_written_in_sized_blocks_are_read(sample: Sample) -> None:
    """Avro's Java writer may write an array as blocks of a negative count followed by the block's size."""
    head, _ = encode_sample(Sample(sample.sample_id, sample.source, sample.tokens, sample.metadata))
    items = []  # a text record is a media record's fields before its media array
    for item in sample.media:
        one, _ = encode_sample(Sample(sample.sample_id, sample.source, sample.tokens, sample.metadata, (item,)))
        items.append(one[len(head) + 1 : -1])  # between the array's count (1) and its end (0)
    blocked = head + b"".join(_zigzag(-1) + _zigzag(len(item)) + item for item in items) + b"\x00"
    read = read_sample(blocked, with_media=True)
    assert read is not None
    assert_reads_as(read, fastavro_record(blocked, True))  # type: ignore[arg-type]
    assert read.media == sample.media
