"""Context-parallel batches (format version 3): built from a plan, through the codec and back, every sample comes
back exactly from the slices of its block; a version-1 reader refuses them; broken layouts are refused."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from topics.errors import DecodeError
from topics.formats.batch import CHECK_TRUSTED_ENV
from topics.formats.batch_codec import decode_any_batch, decode_batch, encode_batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_packing import pack_cp_micro_batches
from topics.formats.cp_slices import IGNORE_INDEX
from topics.formats.sample import Sample

COST = ContextParallelCost()


@st.composite
def steps(draw: st.DrawFn) -> tuple[list[Sample], CPShape]:
    mode = draw(st.sampled_from(list(CPMode)))
    ranks = draw(st.sampled_from([2, 4, 6, 8]))
    size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if s <= ranks and ranks % s == 0]))
    if mode is CPMode.FREE:
        size = draw(st.integers(1, ranks))
    capacity = draw(st.integers(16, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 40))
    lengths = np.clip(rng.lognormal(np.log(capacity / 3), 1.2, n), 1, capacity * size).astype(np.int64)
    samples = [
        Sample(f"s{i}", f"src{i % 3}", rng.integers(0, 50_000, int(length)).astype(np.int32))
        for i, length in enumerate(lengths)
    ]
    return samples, CPShape(ranks, draw(st.integers(1, 3)), capacity, mode, size)


@pytest.fixture(autouse=True, scope="module")
def _check_trusted() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHECK_TRUSTED_ENV, "1")  # the builder's batches checked as fully as decoded ones
        yield


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_every_sample_comes_back_exactly_from_its_blocks_slices(step: tuple[list[Sample], CPShape]) -> None:
    samples, shape = step
    lengths = np.array([s.length for s in samples], np.int64)
    plan = plan_cp_step(lengths, shape, COST)
    batches = build_cp_batches(7, plan, samples, pad_id=-1)
    decoded = []
    for batch in batches:
        got = decode_any_batch(*encode_batch(batch)[1:])
        assert isinstance(got, CPBatch) and got.records.equals(batch.records)
        decoded.append(got)
    # Per sample, the tokens each rank of its block holds at each position, and their labels.
    pieces: dict[str, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    loss_tokens = 0
    for batch in decoded:
        assert batch.loss_tokens == int((lengths[plan.placed_mask] - 1).sum())
        loss_tokens += batch.rank_loss_tokens()
        offsets = batch.offsets
        tokens, labels, positions = batch.tokens, batch.labels, batch.positions
        for row, sample_id in enumerate(batch.sample_ids):
            part = slice(offsets[row], offsets[row + 1])
            first = batch.rank - int(batch.cp_rank[row])
            pieces.setdefault(sample_id, {})[batch.rank] = (tokens[part], labels[part], positions[part])
            i = int(sample_id[1:])
            assert plan.rank[i] == first and plan.cp[i] == batch.cp_size[row]
    assert loss_tokens == decoded[0].loss_tokens if decoded else True
    for i, sample in enumerate(samples):
        if not plan.placed_mask[i]:
            assert sample.sample_id not in pieces
            continue
        held = pieces[sample.sample_id]
        assert sorted(held) == list(range(int(plan.rank[i]), int(plan.rank[i] + plan.cp[i])))
        whole = np.full(sample.length + 2 * int(plan.cp[i]), -7, np.int64)
        label_of = np.full(whole.size, -7, np.int64)
        for part_tokens, part_labels, part_positions in held.values():
            assert (whole[part_positions] == -7).all(), "a position held twice"
            whole[part_positions], label_of[part_positions] = part_tokens, part_labels
        np.testing.assert_array_equal(whole[: sample.length], sample.tokens)
        np.testing.assert_array_equal(label_of[: sample.length - 1], sample.tokens[1:])
        assert label_of[sample.length - 1] == IGNORE_INDEX
        padding = whole != -7
        padding[: sample.length] = False
        assert (whole[padding] == -1).all() and (label_of[padding] == IGNORE_INDEX).all()
    _blocks_run_in_one_order(decoded, plan)
    for batch in decoded:
        _packed_as_megatron_takes_them(batch)


def _packed_as_megatron_takes_them(batch: CPBatch) -> None:
    packed = pack_cp_micro_batches(batch)
    assert len(packed) == batch.micro_batches
    np.testing.assert_array_equal(np.concatenate([np.zeros(0, np.int32), *(p.token_ids for p in packed)]), batch.tokens)
    for micro in packed:
        c = micro.local_cp_size
        whole = np.diff(micro.cu_seqlens)
        padded = np.diff(micro.cu_seqlens_padded)
        assert (padded % (2 * c if c > 1 else 1) == 0).all() and (padded >= whole).all()
        assert micro.token_ids.size * c == micro.cu_seqlens_padded[-1] and micro.max_seqlen == padded.max()
        starts = np.repeat(micro.cu_seqlens_padded[:-1] // c, padded // c)
        within = np.arange(micro.token_ids.size) - starts
        assert ((micro.position_ids >= 0) & (micro.position_ids < np.repeat(padded, padded // c))).all()
        assert within.max(initial=0) < padded.max(initial=1)
        assert micro.labels.dtype == np.int64


def _blocks_run_in_one_order(batches: list[CPBatch], plan: object) -> None:
    """Every rank runs the micro-batches of the blocks it shares in the plan's order, so that the ranks of a block
    start its micro-batch together, whatever else they run."""
    for batch in batches:
        micro = batch.micro_batch
        plan_micro = [int(plan.micro[int(s[1:])]) for s in batch.sample_ids]  # type: ignore[attr-defined]
        assert all(a <= b for a, b in itertools.pairwise(plan_micro))
        assert len(set(zip(micro.tolist(), plan_micro, strict=True))) == len(set(micro.tolist()))


def _one_batch(**changes: object) -> CPBatch:
    samples = [Sample("a", "s", np.arange(1, 11, dtype=np.int32)), Sample("b", "s", np.arange(5, dtype=np.int32))]
    plan = plan_cp_step(np.array([10, 5]), CPShape(2, 1, 6, CPMode.ALIGNED, 2), COST)
    batch = build_cp_batches(0, plan, samples)[0]
    return batch


def test_a_version_1_reader_refuses_a_context_parallel_batch() -> None:
    _key, value, headers = encode_batch(_one_batch())
    assert dict(headers)["mixflow.batch.version"] == b"3"
    with pytest.raises(DecodeError, match=r"this reader knows 1 .*context-parallel"):
        decode_batch(value, headers)
    with pytest.raises(DecodeError, match=r"this reader knows 1 .*context-parallel"):
        decode_batch(value)


@pytest.mark.parametrize(
    ("column", "change", "problem"),
    [
        ("positions", lambda v: v[::-1], "positions are not its slice"),
        ("micro_batch", lambda v: v + 1, "every one of 0"),
        ("cp_rank", lambda v: v + 5, "cp_rank < cp_size"),
        ("length", lambda v: v + 3, "holds"),
    ],
)
def test_a_broken_layout_is_refused(column: str, change: object, problem: str) -> None:
    batch = _one_batch()
    records = batch.records
    index = records.schema.get_field_index(column)
    if column == "positions":
        values = records.column(column)
        flat = values.flatten().to_numpy()
        new = pa.ListArray.from_arrays(values.offsets, pa.array(change(flat), pa.int32()))  # type: ignore[operator]
    else:
        new = pa.array(change(records.column(column).to_numpy()), pa.int32())  # type: ignore[operator]
    broken = records.set_column(index, records.schema.field(index), new)
    fields = {name: getattr(batch, name) for name in CPBatch.__dataclass_fields__ if name != "records"}
    with pytest.raises(ValueError, match=problem):
        CPBatch(**fields, records=broken)
