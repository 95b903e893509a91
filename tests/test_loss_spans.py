"""Loss spans through every cut a sample meets: the labels of version-1 batches (packed by the planner, through
the codec, in the sink's tensors and the HF and Megatron layouts), of context-parallel slices (and the step's
``loss_tokens``), of a conversation split into chunks and of a replayed context-parallel step all equal one
per-sample computation: label ``i`` is token ``i + 1`` where that is a target, ``-100`` elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.multimodal_samples import Segment, chunk_loss_spans
from connectors.readers import Document
from pipeline.planning.scheduler import CostModel, plan_step
from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble import build_batches
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from pipeline.tools.replay.cp_samples import read_step
from topics.errors import DecodeError
from topics.formats.batch import CHECK_TRUSTED_ENV, Batch
from topics.formats.batch_codec import decode_any_batch, decode_batch, encode_batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_packing import pack_cp_micro_batches
from topics.formats.cp_slices import slice_of
from topics.formats.loss_spans import LOSS_SPANS_KEY, format_loss_spans, parse_loss_spans
from topics.formats.packing import pack_micro_batches
from topics.formats.sample import Sample
from topics.formats.sample_codec import decode_sample, encode_sample
from trainer_sink import Layout, micro_batch_tensors
from trainer_sink.integrations.hf_trainer import padding_free_batch
from trainer_sink.integrations.megatron_batch import megatron_batch

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_labels(tokens: np.ndarray, spans: list[tuple[int, int]] | None) -> np.ndarray:
    """Label ``i``: token ``i + 1`` where it is in a span (every token without spans), else -100; one sample."""
    length = len(tokens)
    targets = set(range(length)) if spans is None else {p for a, b in spans for p in range(a, b)}
    return np.array([int(tokens[i + 1]) if i + 1 in targets else -100 for i in range(length)], np.int64)


def spans_of(sample: Sample) -> list[tuple[int, int]] | None:
    text = sample.metadata.get(LOSS_SPANS_KEY)
    if text is None:
        return None
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(",") if part)]


@st.composite
def span_sets(draw: st.DrawFn, length: int) -> list[tuple[int, int]] | None:
    """None (no key: every token), or sorted, apart, non-empty ranges within ``length`` tokens (maybe none)."""
    if draw(st.integers(0, 4)) == 0:
        return None
    points = sorted(draw(st.sets(st.integers(0, length), max_size=8)))
    points = points[: len(points) // 2 * 2]
    return list(zip(points[::2], points[1::2], strict=True))


@st.composite
def samples(draw: st.DrawFn, count: int, longest: int) -> list[Sample]:
    out = []
    for i in range(count):
        length = draw(st.integers(1, longest))
        tokens = np.array(draw(st.lists(st.integers(0, 1000), min_size=length, max_size=length)), np.int32)
        spans = draw(span_sets(length))
        metadata = {} if spans is None else {LOSS_SPANS_KEY: ",".join(f"{a}:{b}" for a, b in spans)}
        out.append(Sample(f"s{i}", f"src{i % 2}", tokens, metadata))
    return out


@pytest.fixture(autouse=True, scope="module")
def _check_trusted() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHECK_TRUSTED_ENV, "1")  # the builders' batches checked as fully as decoded ones
        yield


@SETTINGS
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(samples(n, 40), st.integers(1, 3), st.integers(1, 3))))
def test_planned_packed_batches_label_each_sample_as_alone(case: tuple[list[Sample], int, int]) -> None:
    found, ranks, micro_batches = case
    lengths = np.array([s.length for s in found], np.int64)
    plan = plan_step(lengths, ranks, micro_batches, 64, CostModel(1.0, 50.0))
    by_id = {s.sample_id: s for s in found}
    has_spans = any(LOSS_SPANS_KEY in s.metadata for s in found)
    seen = []
    for built in build_batches(3, plan, found, lengths):
        batch = decode_batch(encode_batch(built)[1])
        assert batch.with_loss_spans == has_spans
        for packed in pack_micro_batches(batch):
            for j, sample_id in enumerate(packed.sample_ids):
                part = slice(packed.cu_seqlens[j], packed.cu_seqlens[j + 1])
                sample = by_id[sample_id]
                expected = reference_labels(sample.tokens, spans_of(sample))
                np.testing.assert_array_equal(packed.labels[part], expected, err_msg=sample_id)
                seen.append(sample_id)
        if has_spans:  # a replay reads the samples back with their spans
            for sample in batch.samples():
                original = by_id[sample.sample_id]
                assert reference_labels(sample.tokens, spans_of(sample)).tolist() == (
                    reference_labels(original.tokens, spans_of(original)).tolist()
                )
    placed = [s.sample_id for s, p in zip(found, plan.placed_mask.tolist(), strict=True) if p]
    assert sorted(seen) == sorted(placed)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 12).flatmap(lambda n: samples(n, 30)), st.sampled_from([1, 8]))
def test_the_sinks_tensors_and_the_adapters_take_the_labels(found: list[Sample], multiple: int) -> None:
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=400, micro_batches=[found[::2], found[1::2]])
    for layout in Layout:
        for tensors in micro_batch_tensors(batch, layout, pad_to_multiple_of=multiple):
            labels = tensors["labels"].numpy()
            expected = [reference_labels(s.tokens, spans_of(s)) for s in found if s.sample_id in tensors["sample_ids"]]
            flat = np.concatenate([np.zeros(0, np.int64), *expected])
            np.testing.assert_array_equal(labels[: flat.size], flat)
            assert (labels[flat.size :] == -100).all()
            if layout is Layout.PADDED or multiple > 1 or not flat.size:
                continue
            hf = padding_free_batch(tensors)["labels"][0].numpy()  # transformers shifts them back itself
            np.testing.assert_array_equal(hf[1 : flat.size + 1], flat[: hf.size - 1])
            mega = megatron_batch(tensors)
            assert int(mega["loss_mask"].sum()) == int((flat != -100).sum())


@st.composite
def cp_steps(draw: st.DrawFn) -> tuple[list[Sample], CPShape]:
    mode = draw(st.sampled_from(list(CPMode)))
    ranks = draw(st.sampled_from([2, 4]))
    size = draw(st.sampled_from([s for s in (1, 2, 4) if s <= ranks]))
    capacity = draw(st.integers(8, 40))
    found = draw(st.integers(0, 14).flatmap(lambda n: samples(n, capacity * size)))
    return found, CPShape(ranks, draw(st.integers(1, 3)), capacity, mode, size)


@SETTINGS
@given(cp_steps())
def test_context_parallel_slices_label_each_sample_as_alone(step: tuple[list[Sample], CPShape]) -> None:
    found, shape = step
    lengths = np.array([s.length for s in found], np.int64)
    plan = plan_cp_step(lengths, shape, ContextParallelCost())
    built = build_cp_batches(5, plan, found, pad_id=-1)
    batches = [decode_any_batch(encode_batch(b)[1]) for b in built]
    assert all(isinstance(b, CPBatch) for b in batches)
    by_id = {s.sample_id: s for s in found}
    placed = [s for s, p in zip(found, plan.placed_mask.tolist(), strict=True) if p]
    expected = {s.sample_id: reference_labels(s.tokens, spans_of(s)) for s in placed}
    loss_tokens = sum(int((labels != -100).sum()) for labels in expected.values())
    for batch in batches:
        assert isinstance(batch, CPBatch) and batch.loss_tokens == loss_tokens
        offsets, labels, positions = batch.offsets, batch.labels, batch.positions
        for row, sample_id in enumerate(batch.sample_ids):
            part = slice(offsets[row], offsets[row + 1])
            whole = np.concatenate([expected[sample_id], np.full(positions[part].max() + 1, -100)])
            np.testing.assert_array_equal(labels[part], whole[positions[part]], err_msg=sample_id)
            sample = by_id[sample_id]
            if LOSS_SPANS_KEY in sample.metadata:
                bounds = parse_loss_spans(sample.metadata[LOSS_SPANS_KEY], sample.length)
                cut = slice_of(sample.tokens, int(batch.cp_size[row]), int(batch.cp_rank[row]), -1, bounds)
                np.testing.assert_array_equal(labels[part], cut[1])
        for packed in pack_cp_micro_batches(batch):
            assert packed.labels.dtype == np.int64
    assert sum(b.rank_loss_tokens() for b in batches) == loss_tokens
    for sample in read_step(batches).samples:  # a replay puts the samples back with the targets they had
        np.testing.assert_array_equal(reference_labels(sample.tokens, spans_of(sample)), expected[sample.sample_id])


@SETTINGS
@given(st.data())
def test_a_conversation_split_into_chunks_keeps_its_targets(data: st.DataObject) -> None:
    parts = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    trained = frozenset(data.draw(st.sets(st.integers(0, len(parts) - 1))))
    eod = data.draw(st.booleans())
    document = Document("chat", "c.jsonl", 0, parts=tuple("x" * n for n in parts), trained=trained)
    segments = [Segment(np.arange(n, dtype=np.int32)) for n in parts] + ([Segment(np.zeros(1, np.int32))] * eod)
    flags = [k in trained for k in range(len(parts))] + [len(parts) - 1 in trained] * eod
    mask = np.concatenate([np.full(len(s.tokens), f) for s, f in zip(segments, flags, strict=True)])
    cuts = sorted(data.draw(st.sets(st.integers(1, mask.size - 1), max_size=5))) if mask.size > 1 else []
    bounds = [0, *cuts, mask.size]
    spans = chunk_loss_spans(document, segments, np.diff(bounds).tolist())
    assert spans is not None and len(spans) == len(bounds) - 1
    for text, start, stop in zip(spans, bounds[:-1], bounds[1:], strict=True):
        chunk = np.zeros(stop - start, bool)
        for a, b in (p.split(":") for p in text.split(",") if p):
            chunk[int(a) : int(b)] = True
        np.testing.assert_array_equal(chunk, mask[start:stop])
        assert format_loss_spans(parse_loss_spans(text, stop - start)) == text


def test_a_batch_without_spans_trains_on_every_next_token() -> None:
    found = [Sample("a", "s", np.arange(5, dtype=np.int32)), Sample("b", "s", np.arange(3, dtype=np.int32))]
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=16, micro_batches=[found])
    assert not batch.with_loss_spans and batch.records.num_columns == 4 and batch.targets() is None
    (packed,) = pack_micro_batches(decode_batch(encode_batch(batch)[1]))
    assert packed.labels.tolist() == [1, 2, 3, 4, -100, 1, 2, -100]


@pytest.mark.parametrize(
    "text", ["0:", "1:1", "3:2", "0:2,1:3", "2:4,0:1", "0:6", "a:b", "0:1;2:3", " 0:1", "-1:2", "0:1,"]
)
def test_spans_that_do_not_fit_the_sample_are_refused(text: str) -> None:
    sample = Sample("chat/c.jsonl/0", "chat", np.arange(5, dtype=np.int32), {LOSS_SPANS_KEY: text})
    with pytest.raises(ValueError, match="loss_spans"):
        encode_sample(sample)
    if len(text) == 3:  # the same spans written past the encoder's check are refused by the decoder
        good, headers = encode_sample(Sample(sample.sample_id, "chat", sample.tokens, {LOSS_SPANS_KEY: "0:1"}))
        with pytest.raises(DecodeError, match="loss_spans"):
            decode_sample(good.replace(b"0:1", text.encode()), headers)


@pytest.mark.parametrize(("bounds", "problem"), [([1], "odd"), ([2, 1], "empty or reversed"), ([0, 9], "after")])
def test_a_batch_whose_spans_do_not_fit_is_refused(bounds: list[int], problem: str) -> None:
    good = Batch.from_arrays(
        step=0,
        rank=0,
        ranks=1,
        micro_batches=1,
        capacity=8,
        sample_ids=["a"],
        sources=["s"],
        micro_batch=[0],
        offsets=[0, 4],
        tokens=np.arange(4, dtype=np.int32),
        loss_spans=[np.array([1, 3], np.int32)],
    )
    columns = [*good.records.columns[:4], pa.array([bounds], pa.list_(pa.int32()))]
    records = pa.RecordBatch.from_arrays(columns, schema=good.records.schema)
    with pytest.raises(ValueError, match=problem):
        Batch(0, 0, 1, 1, 8, records)
    value = encode_batch(good)[1]
    assert decode_batch(value).loss_bounds()[1].tolist() == [1, 3]
