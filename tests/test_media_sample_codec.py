"""Samples with media through the Avro codec: round trips, text samples unchanged, damage refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.media_strategies import media_samples
from topics.errors import DecodeError
from topics.formats.media import MediaItem
from topics.formats.sample import Sample
from topics.formats.sample_codec import (
    MEDIA_SAMPLE_FINGERPRINT,
    SAMPLE_FINGERPRINT,
    SCHEMA_HEADER,
    decode_sample,
    encode_sample,
)


@settings(deadline=None, max_examples=100)
@given(media_samples())
def test_media_samples_round_trip(sample: Sample) -> None:
    value, headers = encode_sample(sample)
    assert headers == [(SCHEMA_HEADER, MEDIA_SAMPLE_FINGERPRINT)]
    decoded = decode_sample(value, headers)
    assert decoded.media == sample.media
    np.testing.assert_array_equal(decoded.tokens, sample.tokens)
    assert (decoded.sample_id, decoded.metadata, decoded.patches) == (sample.sample_id, sample.metadata, sample.patches)


def test_text_samples_keep_their_schema_and_bytes() -> None:
    sample = Sample("s/a.txt/0", "s", np.arange(5, dtype=np.int32))
    value, headers = encode_sample(sample)
    assert headers == [(SCHEMA_HEADER, SAMPLE_FINGERPRINT)]
    assert (SAMPLE_FINGERPRINT.hex(), MEDIA_SAMPLE_FINGERPRINT.hex()) == ("8c3b67499c1c0a9a", "29225652eaf953f0")
    assert decode_sample(value, headers).media == ()


@settings(deadline=None, max_examples=100)
@given(media_samples(), st.data())
def test_damaged_media_records_decode_or_refuse(sample: Sample, data: st.DataObject) -> None:
    value, headers = encode_sample(sample)
    cut = data.draw(st.integers(0, len(value) - 1))
    with pytest.raises(DecodeError):
        decode_sample(value[:cut], headers)
    flipped = bytearray(value)
    at = data.draw(st.integers(0, len(value) - 1))
    flipped[at] ^= 1 << data.draw(st.integers(0, 7))
    try:
        decoded = decode_sample(bytes(flipped), headers)
    except DecodeError:
        return
    for item in decoded.media:
        item.check()
        assert item.token_offset + item.tokens <= decoded.length


def test_placeholders_past_the_tokens_are_refused_when_writing() -> None:
    item = MediaItem("image", 1, 2, 2, 2, 2, 2, 2, 4, "raw", (bytes(12),))
    with pytest.raises(ValueError, match="placeholders run past"):
        encode_sample(Sample("s/x/0", "s", np.zeros(4, np.int32), {}, (item,)))
