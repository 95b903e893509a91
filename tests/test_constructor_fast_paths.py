"""The constructor's fast paths give what the straightforward code gives: the sample decoder's fast path
against fastavro, the batches built from a plan against ``Batch.from_samples``, the IPC bytes against
pyarrow's default writer, and the pool's FIFO against a plain list model. No Kafka."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Message
from fastavro import schemaless_reader
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import Draw, DrawStatus, MixerState
from pipeline.planning.order import candidate_order
from pipeline.planning.scheduler import CostModel, plan_step, rank_order
from pipeline.planning.step.assemble import build_batches
from pipeline.planning.step.pool import SamplePool, SourceFifo
from pipeline.planning.step.state import ConstructorState, SourcePosition
from tests.length_families import FAMILIES, draw_lengths
from topics.errors import DecodeError
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch
from topics.formats.sample import Sample
from topics.formats.sample_codec import (
    SAMPLE_FINGERPRINT,
    SAMPLE_SCHEMA,
    SCHEMA_HEADER,
    decode_sample,
    decode_sample_message,
    encode_sample,
)

HEADERS = [(SCHEMA_HEADER, SAMPLE_FINGERPRINT)]
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


def _fastavro(value: bytes) -> dict | None:
    """What fastavro reads from ``value`` when it is exactly one record, else None."""
    stream = io.BytesIO(value)
    try:
        record = schemaless_reader(stream, SAMPLE_SCHEMA, None)
    except Exception:
        return None
    return record if stream.tell() == len(value) else None


@settings(deadline=None, max_examples=300)
@given(
    sample_id=texts,
    source=texts,
    tokens=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40),
    metadata=st.one_of(st.just({}), st.dictionaries(texts, texts, max_size=3)),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
    extra=st.binary(max_size=3),
)
def test_sample_decoding_agrees_with_fastavro(sample_id, source, tokens, metadata, flips, cut, extra) -> None:
    """Intact, damaged, truncated or extended records: the decoder gives fastavro's record (where it reads
    one whole, consistent record) or DecodeError, never anything else."""
    value, headers = encode_sample(Sample(sample_id, source, np.asarray(tokens, np.int32), metadata))
    assert headers == HEADERS
    damaged = bytearray(value)
    for at, bits in flips:
        damaged[at % len(damaged)] ^= bits
    value = bytes(damaged[:cut] if cut is not None else damaged) + extra
    record = _fastavro(value)
    consistent = (
        record is not None and len(record["tokens"]) % 4 == 0 and record["length"] == len(record["tokens"]) // 4
    )
    try:
        decoded = decode_sample(value, headers)
    except DecodeError:
        assert not consistent, f"refused a record fastavro reads: {record}"
        return
    assert consistent, "decoded a record fastavro refuses"
    assert (decoded.sample_id, decoded.source, decoded.metadata) == (
        record["id"],
        record["source"],
        record["metadata"] or {},
    )
    assert decoded.tokens.dtype == np.int32
    np.testing.assert_array_equal(decoded.tokens, np.frombuffer(record["tokens"], "<i4"))


@pytest.mark.parametrize("distribution", FAMILIES)
@pytest.mark.parametrize("seed", range(4))
def test_batches_are_those_of_from_samples(distribution: str, seed: int) -> None:
    """Byte for byte what ``Batch.from_samples`` gives for each rank's micro-batches in ``rank_order``."""
    rng = np.random.default_rng(seed)
    ranks, micro_batches, capacity = int(rng.integers(1, 48)), int(rng.integers(1, 5)), int(rng.integers(64, 4096))
    count = int(rng.integers(0, ranks * micro_batches * 6 + 2))
    lengths = draw_lengths(distribution, rng, count, capacity)
    sources = ["web", "code", "bücher", "m"]
    samples = [
        Sample(f"s/{i}", sources[int(rng.integers(0, 4))], rng.integers(0, 50_000, int(n), dtype=np.int32))
        for i, n in enumerate(lengths)
    ]
    plan = plan_step(lengths, ranks, micro_batches, capacity, CostModel(1.0, 50.0))
    built = build_batches(7, plan, samples, lengths)
    assert len(built) == ranks
    for rank, batch in enumerate(built):
        indices, micro = rank_order(plan, rank)
        groups = [
            [samples[i] for i, m in zip(indices.tolist(), micro.tolist(), strict=True) if m == k]
            for k in range(micro_batches)
        ]
        expected = Batch.from_samples(step=7, rank=rank, ranks=ranks, capacity=capacity, micro_batches=groups)
        assert encode_batch(batch) == encode_batch(expected), f"rank {rank}"


def test_encoded_batches_are_pyarrows_default_stream() -> None:
    samples = [[Sample("a/0", "a", np.arange(5, dtype=np.int32))], [Sample("b/1", "b", np.arange(3, dtype=np.int32))]]
    batch = Batch.from_samples(step=1, rank=0, ranks=1, capacity=8, micro_batches=samples)
    _, value, headers = encode_batch(batch)
    records = batch.records.replace_schema_metadata(dict(headers))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, records.schema) as writer:
        writer.write_batch(records)
    assert value == sink.getvalue().to_pybytes()


@settings(deadline=None, max_examples=100)
@given(
    lengths=st.lists(st.integers(1, 100), max_size=40),
    takes=st.lists(st.one_of(st.integers(0, 40), st.sets(st.integers(0, 39), max_size=10)), max_size=6),
)
def test_fifo_takes_like_a_list(lengths: list[int], takes: list) -> None:
    """Heads (an int: that many from the front) and arbitrary positions (a set) alike."""
    fifo = SourceFifo(SourcePosition(0))
    model = []
    for offset, n in enumerate(lengths):
        sample = Sample(f"s/{offset}", "s", np.zeros(n, np.int32))
        fifo.append(offset, sample)
        model.append((offset, sample))
    for take in takes:
        positions = (
            list(range(min(take, len(model)))) if isinstance(take, int) else sorted(p for p in take if p < len(model))
        )
        got = fifo.take(np.asarray(positions, dtype=np.int64))
        assert [(c.ref.offset, c.sample) for c in got] == [model[p] for p in positions]
        model = [m for i, m in enumerate(model) if i not in set(positions)]
        assert fifo.offsets == [o for o, _ in model]
        assert fifo.lengths == [s.length for _, s in model]
        assert fifo.tokens == sum(s.length for _, s in model)


@pytest.mark.parametrize("seed", range(6))
def test_pool_hands_the_draw_over_in_the_candidate_order(seed: int) -> None:
    """``SamplePool.take`` gives the drawn samples in ``candidate_order`` (the step core's), heads or not."""
    rng = np.random.default_rng(seed)
    sources = ["a", "b", "c"]
    pool = SamplePool(ConstructorState.initial(MixerState.initial(sources)))
    for s in sources:
        for offset in range(int(rng.integers(0, 30))):
            pool.add(s, offset, Sample(f"{s}/{offset}", s, np.zeros(int(rng.integers(1, 5)) * 8, np.int32)))
    positions = {
        s: np.flatnonzero(rng.random(len(pool.fifos[s].offsets)) < 0.6)
        if seed % 2
        else np.arange(min(int(rng.integers(0, 8)), len(pool.fifos[s].offsets)))
        for s in sources
    }
    window = pool.window()
    numbered = [pool.fifos[s].samples[i] for s in sources for i in positions[s].tolist()]
    order = candidate_order(0, [window.available[s][positions[s]] for s in sources])
    assert [c.sample for c in pool.take(positions)] == [numbered[i] for i in order.tolist()]


@pytest.mark.parametrize("seed", range(6))
def test_a_placement_reaches_each_candidate_in_the_pools_order(seed: int) -> None:
    """``Draw.start_for`` over ``SamplePool.take``'s candidates gives each one the slot ``Draw.placement``
    lists for it: per source, its deferred samples (in the pool's order) and then the drawn ones in FIFO
    order, however the sources interleave."""
    rng = np.random.default_rng(seed)
    sources = ["a", "b", "c"]
    pool = SamplePool(ConstructorState.initial(MixerState.initial(sources)))
    for s in sources:
        for offset in range(int(rng.integers(0, 30))):
            pool.add(s, offset, Sample(f"{s}/{offset}", s, np.zeros(int(rng.integers(1, 5)) * 8, np.int32)))
    first = pool.take({s: np.flatnonzero(rng.random(len(pool.fifos[s].offsets)) < 0.3) for s in sources})
    pool.settle([], [first[i] for i in rng.permutation(len(first)).tolist()])  # all deferred, shuffled
    positions = {s: np.flatnonzero(rng.random(len(pool.fifos[s].offsets)) < 0.6) for s in sources}
    in_draw = {s: [c.sample.sample_id for c in pool.deferred if c.ref.source == s] for s in sources}
    for s in sources:
        in_draw[s] += [pool.fifos[s].samples[i].sample_id for i in positions[s].tolist()]
    # A slot that names the sample: its source and its place in ``Draw.lengths``.
    placement = {s: 1000 * k + np.arange(len(in_draw[s])) for k, s in enumerate(sources)}
    draw = Draw(0, DrawStatus.OK, placement=placement)
    candidates = pool.take(positions)
    start = draw.start_for([c.ref.source for c in candidates])
    assert start is not None
    for c, slot in zip(candidates, start.tolist(), strict=True):
        k = sources.index(c.ref.source)
        assert slot // 1000 == k and in_draw[c.ref.source][slot % 1000] == c.sample.sample_id
    assert Draw(0, DrawStatus.OK).start_for([c.ref.source for c in candidates]) is None
    with pytest.raises(ValueError, match="samples of 'a' for a placement of"):
        draw.start_for(["a"] * (len(placement["a"]) + 1))


@settings(deadline=None, max_examples=100)
@given(sample_id=texts, tokens=st.lists(st.integers(0, 50_000), max_size=20), cut=st.integers(0, 200))
def test_messages_decode_as_values_do(sample_id: str, tokens: list[int], cut: int) -> None:
    """``decode_sample_message``'s own fast path: the same sample, or the same error naming the record."""
    value, headers = encode_sample(Sample(sample_id, "s", np.asarray(tokens, np.int32)))
    value = value[: len(value) - cut % 3]
    message = Message(topic="j.src.s", partition=0, offset=3, value=value, headers=headers)
    try:
        expected = decode_sample(value, headers)
    except DecodeError as error:
        with pytest.raises(DecodeError, match="offset=3") as got:
            decode_sample_message(message)
        assert got.value.reason == error.reason
        return
    got_sample = decode_sample_message(message)
    assert (got_sample.sample_id, got_sample.source, got_sample.metadata) == (expected.sample_id, "s", {})
    np.testing.assert_array_equal(got_sample.tokens, expected.tokens)
