"""The media column of a batch: round trips, a text batch unchanged byte for byte, and the checks on decode
(placeholders inside their sample, the patch budget, frames that agree with the grid)."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sink_media_support import IMAGE_TOKEN, media_batches, media_sample
from tests.test_batch_codec import assert_invariants, assert_same
from topics.errors import DecodeError
from topics.formats.batch import BATCH_SCHEMA, MEDIA_BATCH_SCHEMA, Batch
from topics.formats.batch_codec import PATCHES_KEY, decode_batch, encode_batch
from topics.formats.media_column import MEDIA_FIELD
from topics.formats.sample import Sample


def assert_same_media(a: Batch, b: Batch) -> None:
    assert_same(a, b)
    assert a.with_media == b.with_media
    assert a.patches_per_micro_batch == b.patches_per_micro_batch
    assert [s.media for s in a.samples()] == [s.media for s in b.samples()]


@settings(deadline=None, max_examples=40)
@given(batch=media_batches(encodings=("raw", "png", "jpeg")))
def test_round_trip_with_media(batch: Batch) -> None:
    _, value, headers = encode_batch(batch)
    decoded = decode_batch(value, headers)
    assert_same_media(decoded, batch)
    assert_same_media(decode_batch(value), batch)
    assert decoded.records.schema.remove_metadata().equals(MEDIA_BATCH_SCHEMA)
    assert_invariants(decoded)
    budget = dict(headers).get(PATCHES_KEY)
    assert budget == (None if batch.patches_per_micro_batch is None else str(batch.patches_per_micro_batch).encode())


@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_samples_give_back_their_media(seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = [media_sample(rng, f"vl/{i}", [("image", (1, 2, 4)), ("video", (2, 2, 2))][: i % 3]) for i in range(4)]
    batch = Batch.from_samples(step=1, rank=0, ranks=1, capacity=10_000, micro_batches=[samples], with_media=True)
    for got, expected in zip(decode_batch(encode_batch(batch)[1]).samples(), samples, strict=True):
        assert got.media == expected.media
        assert got.patches == expected.patches
        np.testing.assert_array_equal(got.tokens, expected.tokens)


def test_a_text_batch_encodes_to_the_pinned_bytes() -> None:
    """A text batch (no media column) encodes to the bytes pinned here."""
    rng = np.random.default_rng(7)
    groups = [
        [
            Sample(f"web/a/{i}", ["web", "code"][i % 2], rng.integers(0, 50_000, 5 + i, dtype=np.int32))
            for i in range(3)
        ],
        [],
        [Sample("code/b/9#1", "code", np.arange(4, dtype=np.int32))],
    ]
    batch = Batch.from_samples(step=17, rank=1, ranks=4, capacity=64, micro_batches=groups)
    key, value, headers = encode_batch(batch)
    digest = hashlib.sha256(key + value + repr(headers).encode()).hexdigest()
    assert digest == "b4b6cf7404b47ebf76251ca4272cae6a6a89be1c8810de6d77bc530a6c11df74"
    assert not batch.with_media and decode_batch(value, headers).records.schema.remove_metadata().equals(BATCH_SCHEMA)


def test_a_job_with_media_keeps_the_column_on_text_only_batches() -> None:
    groups = [[Sample("web/a/0", "web", np.arange(3, dtype=np.int32))], []]
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=8, micro_batches=groups, with_media=True)
    decoded = decode_batch(encode_batch(batch)[1])
    assert decoded.with_media and len(decoded.media) == 0
    assert decoded.samples()[0].media == ()
    sample = media_sample(np.random.default_rng(0), "x", [("image", (1, 2, 2))])
    with pytest.raises(ValueError, match="with_media=False"):
        Batch.from_samples(step=0, rank=0, ranks=1, capacity=99, micro_batches=[[sample]])


def _one_image_batch(**changes) -> Batch:
    sample = media_sample(np.random.default_rng(1), "vl/0", [("image", (1, 2, 4))], text=(3, 4))
    item = dataclasses.replace(sample.media[0], **changes)
    return Batch.from_samples(
        step=0,
        rank=0,
        ranks=1,
        capacity=100,
        micro_batches=[[dataclasses.replace(sample, media=(item,))]],
        with_media=True,
    )


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"token_offset": 100}, "run past the end of its sample"),
        ({"token_offset": 3}, "not all one token id"),
        ({"frames": (b"\0" * 10,)}, "a raw frame of 28x56 RGB must hold 4704 bytes"),
        ({"frames": ()}, "holds 0 frames, expected 1"),
        ({"grid_w": 3}, "not a grid of square patches"),
        ({"kind": "audio"}, "media kind 'audio'"),
        ({"encoding": "gif"}, "pixel encoding 'gif'"),
    ],
)
def test_bad_media_is_refused(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _one_image_batch(**changes)


def test_overlapping_and_misordered_items_are_refused() -> None:
    rng = np.random.default_rng(3)
    sample = media_sample(rng, "vl/0", [("image", (1, 2, 2)), ("image", (1, 2, 2))])
    first, second = sample.media
    for media in [(second, first), (first, dataclasses.replace(second, token_offset=first.token_offset))]:
        with pytest.raises(ValueError, match="overlap the next item's"):
            Batch.from_samples(
                step=0,
                rank=0,
                ranks=1,
                capacity=100,
                micro_batches=[[dataclasses.replace(sample, media=media)]],
                with_media=True,
            )


def test_the_patch_budget_holds_per_micro_batch() -> None:
    rng = np.random.default_rng(4)
    a, b = (media_sample(rng, f"vl/{i}", [("image", (1, 4, 4))]) for i in range(2))  # 16 patches each
    build = Batch.from_samples
    assert build(
        step=0, rank=0, ranks=1, capacity=99, micro_batches=[[a], [b]], with_media=True, patches_per_micro_batch=16
    )
    with pytest.raises(ValueError, match="micro-batch 0 holds 32 patches, over the budget of 16"):
        build(step=0, rank=0, ranks=1, capacity=99, micro_batches=[[a, b]], with_media=True, patches_per_micro_batch=16)
    with pytest.raises(ValueError, match="patches_per_micro_batch must be at least 1"):
        build(step=0, rank=0, ranks=1, capacity=99, micro_batches=[[a]], with_media=True, patches_per_micro_batch=0)


def _stream(records: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, records.schema) as writer:
        writer.write_batch(records)
    return sink.getvalue().to_pybytes()


def test_decoding_checks_the_media_and_the_budget() -> None:
    rng = np.random.default_rng(5)
    sample = media_sample(rng, "vl/0", [("image", (1, 2, 4))], text=(2, 3))
    batch = Batch.from_samples(
        step=0, rank=0, ranks=1, capacity=99, micro_batches=[[sample]], with_media=True, patches_per_micro_batch=8
    )
    _, value, headers = encode_batch(batch)
    records = decode_batch(value).records
    meta = dict(records.schema.metadata)
    # A budget lower than what the micro-batch holds, in both the metadata and the header.
    lowered = {**meta, PATCHES_KEY.encode(): b"7"}
    with pytest.raises(DecodeError, match="micro-batch 0 holds 8 patches, over the budget of 7"):
        decode_batch(_stream(records.replace_schema_metadata(lowered)))
    with pytest.raises(DecodeError, match=f"header {PATCHES_KEY} is b'5' but the schema metadata says b'8'"):
        decode_batch(value, [(k, b"5" if k == PATCHES_KEY else v) for k, v in headers])
    # A placeholder token overwritten: the sample's tokens no longer hold the item's placeholders.
    tokens = records.column("tokens").flatten().to_numpy().copy()
    tokens[np.flatnonzero(tokens == IMAGE_TOKEN)[-1]] = 7
    moved = records.set_column(
        3, "tokens", pa.ListArray.from_arrays(records.column("tokens").offsets, pa.array(tokens))
    )
    with pytest.raises(DecodeError, match="not all one token id"):
        decode_batch(_stream(moved))
    retyped = records.set_column(4, "media", pa.array([[]], pa.list_(pa.int32())))
    with pytest.raises(DecodeError, match="column 'media' has type"):
        decode_batch(_stream(retyped))


@settings(deadline=None, max_examples=100)
@given(batch=media_batches(), data=st.data())
def test_flipped_bytes_in_a_media_batch_raise_decode_error_or_keep_the_invariants(batch: Batch, data) -> None:
    _, value, headers = encode_batch(batch)
    damaged = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(value) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_batch(bytes(damaged), headers)
    except DecodeError:
        return
    assert_invariants(decoded)
    for sample in decoded.samples():
        for item in sample.media:
            item.check()
            assert item.token_offset + item.tokens <= sample.length


def test_media_field_is_the_fifth_column() -> None:
    assert MEDIA_BATCH_SCHEMA.names == [*BATCH_SCHEMA.names, MEDIA_FIELD.name]


@settings(deadline=None, max_examples=20)
@given(batch=media_batches())
def test_a_trusted_batch_with_media_is_the_checked_one(batch: Batch) -> None:
    fields = ("step", "rank", "ranks", "micro_batches", "capacity", "sample_ids", "sources", "micro_batch", "offsets")
    arguments = {name: getattr(batch, name) for name in fields}
    arguments.update(
        tokens=batch.tokens,
        with_media=True,
        media=[s.media for s in batch.samples()],
        patches_per_micro_batch=batch.patches_per_micro_batch,
    )
    trusted = Batch.from_arrays(**arguments, trusted=True)
    assert trusted == Batch.from_arrays(**arguments) == batch
