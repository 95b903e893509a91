"""Context-parallel batches on the wire (version 3): what ``to_wire`` writes, ``from_wire`` rebuilds exactly, in
about a third of the bytes; version-2 messages (labels and positions carried) still decode; and a message
whose runs or chunk tokens do not fit its slices is refused in one line."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from topics.errors import DecodeError
from topics.formats.batch_codec import VERSION_KEY, decode_any_batch, encode_batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_wire import CP_WIRE_SCHEMA, from_wire, to_wire
from topics.formats.loss_spans import LOSS_SPANS_KEY
from topics.formats.sample import Sample


def _samples(rng: np.random.Generator, lengths: list[int], with_spans: bool) -> list[Sample]:
    samples = []
    for i, n in enumerate(lengths):
        metadata = {}
        if with_spans and rng.random() < 0.7:
            cuts = np.unique(rng.integers(0, n + 1, int(rng.integers(0, 7))))
            pairs = [(int(a), int(b)) for a, b in zip(cuts[0::2], cuts[1::2], strict=False) if b > a]
            metadata = {LOSS_SPANS_KEY: ",".join(f"{a}:{b}" for a, b in pairs)}
        samples.append(Sample(f"s/{i}", "web", rng.integers(0, 50_000, n).astype(np.int32), metadata=metadata))
    return samples


def _batches(seed: int, mode: CPMode, with_spans: bool) -> list[CPBatch]:
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.choice([1, 2, 5, 9, 17, 40, 64, 100, 250], int(rng.integers(1, 12)))]
    plan = plan_cp_step(np.array(lengths), CPShape(4, 2, 128, mode, 4), ContextParallelCost())
    return build_cp_batches(seed % 1000, plan, _samples(rng, lengths, with_spans))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from([CPMode.STATIC, CPMode.ALIGNED, CPMode.FREE]),
    with_spans=st.booleans(),
)
def test_the_wire_form_rebuilds_every_label_and_position(seed: int, mode: CPMode, with_spans: bool) -> None:
    for batch in _batches(seed, mode, with_spans):
        wire = to_wire(batch)
        assert wire.schema == CP_WIRE_SCHEMA
        assert from_wire(wire).equals(batch.records)
        _, value, headers = encode_batch(batch)
        decoded = decode_any_batch(value, headers)
        assert isinstance(decoded, CPBatch) and decoded.records.equals(batch.records)
        assert dict(headers)[VERSION_KEY] == b"3"


def test_a_long_sample_travels_in_about_the_bytes_of_its_slice_tokens() -> None:
    rng = np.random.default_rng(1)
    samples = _samples(rng, [32_000, 30_000], with_spans=True)
    plan = plan_cp_step(np.array([32_000, 30_000]), CPShape(8, 1, 8192, CPMode.ALIGNED, 8), ContextParallelCost())
    for batch in build_cp_batches(0, plan, samples):
        _, value, _ = encode_batch(batch)
        slice_bytes = 4 * batch.tokens.size
        assert len(value) <= 1.1 * slice_bytes + 2048, (len(value), slice_bytes)


def test_a_version_2_message_still_decodes() -> None:
    for batch in _batches(3, CPMode.ALIGNED, with_spans=True):
        _, _, headers = encode_batch(batch)
        headers = [(k, b"2" if k == VERSION_KEY else v) for k, v in headers]
        meta = {k: v for k, v in headers}
        records = batch.records.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, records.schema) as writer:
            writer.write_batch(records)
        decoded = decode_any_batch(sink.getvalue().to_pybytes(), headers)
        assert isinstance(decoded, CPBatch) and decoded.records.equals(batch.records)


def test_labels_that_are_not_next_tokens_are_refused_on_the_way_out() -> None:
    batch = next(b for b in _batches(4, CPMode.ALIGNED, with_spans=False) if b.num_samples)
    offsets = batch.offsets
    labels = batch.labels.copy()
    labels[0] = labels[0] + 1 if labels[0] >= 0 else 7
    broken = CPBatch.from_arrays(
        step=batch.step, rank=batch.rank, ranks=batch.ranks, max_micro_batches=batch.max_micro_batches,
        capacity=batch.capacity, mode=batch.mode, loss_tokens=batch.loss_tokens, sample_ids=batch.sample_ids,
        sources=batch.sources, micro_batch=batch.micro_batch, lengths=batch.lengths, cp_size=batch.cp_size,
        cp_rank=batch.cp_rank, offsets=offsets, tokens=batch.tokens, labels=labels, positions=batch.positions,
    )  # fmt: skip
    with pytest.raises(ValueError, match="row 0: the label of slice token 0 is not its next token"):
        to_wire(broken)


@pytest.mark.parametrize(
    ("column", "values", "said"),
    [
        ("label_runs", [[0, 99_999]], "a label run lies outside its slice or is empty"),
        ("label_runs", [[0]], r"label_runs must hold \[start, stop\) pairs"),
        ("chunk_next", [[1, 2, 3]], "does not hold one token per chunk"),
    ],
)
def test_a_wire_batch_that_does_not_fit_its_slices_is_refused(column: str, values: list, said: str) -> None:
    batch = next(b for b in _batches(5, CPMode.ALIGNED, with_spans=False) if b.num_samples)
    wire = to_wire(batch)
    replaced = pa.array(values + wire.column(column).to_pylist()[1:], pa.list_(pa.int32()))
    broken = wire.set_column(wire.schema.get_field_index(column), column, replaced)
    with pytest.raises(ValueError, match=said):
        from_wire(broken)
    _, value, headers = encode_batch(batch)
    assert value and headers  # the encoded message itself is sound
    with pytest.raises(DecodeError):
        decode_any_batch(b"not arrow", headers)
