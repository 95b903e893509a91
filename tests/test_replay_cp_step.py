"""Replaying a context-parallel step over another number of ranks, without the broker: its samples come back
whole from their slices, each once, and are planned as ``plan_cp_step`` plans them over the new shape (what it
defers placed after it); the new shape follows the spec's mode; the audit tells slices missing, repeated or
relabelled."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Message
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from pipeline.planning.scheduler.context_parallel import cp_sizes, plan_cp_step, validate_cp_plan
from pipeline.planning.scheduler.cp_plan import CPMode, CPPlan, CPShape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.tools.replay.audit import same_samples
from pipeline.tools.replay.cp_samples import SlicesError, read_step, whole_samples
from pipeline.tools.replay.reshape import ReshapeError, default_micro_batches
from pipeline.tools.replay.reshape_cp import (
    _place_the_rest,
    _whole_block_micro_batches,
    replan_cp_step,
    replay_cp_shape,
    reshape_cp_step,
)
from pipeline.tools.replay.steps import StepMessages
from tests.cp_replay_support import COST, checked, cp_step, ids_and_tokens, step_samples, values
from tests.length_families import FAMILIES
from topics.errors import MixflowError
from topics.formats.batch_codec import encode_batch
from topics.formats.cp_batch import CPBatch
from topics.formats.sample import Sample

CAPACITY = 64


@st.composite
def original_shapes(draw: st.DrawFn, modes: tuple[CPMode, ...] = tuple(CPMode)) -> CPShape:
    """A context-parallel step of 2, 4 or 8 ranks of 1 to 3 micro-batches, with a size of its mode."""
    mode = draw(st.sampled_from(modes))
    ranks = draw(st.sampled_from([2, 4, 8]))
    powers = [1 << k for k in range(ranks.bit_length()) if ranks % (1 << k) == 0]
    size = draw(st.integers(2, ranks) if mode is CPMode.FREE else st.sampled_from(powers[1:]))
    return CPShape(ranks, draw(st.integers(1, 3)), CAPACITY, mode, size)


@settings(deadline=None, max_examples=30)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=original_shapes(),
    new_ranks=st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
    family=st.sampled_from(FAMILIES),
)
def test_a_replayed_step_is_plan_cp_step_over_the_new_shape_with_every_sample_once(
    seed: int, shape: CPShape, new_ranks: int, family: str
) -> None:
    rng = np.random.default_rng(seed)
    batches = cp_step(rng, family, shape, int(rng.integers(1, 40)))
    expected = step_samples(batches)
    assert ids_and_tokens(whole_samples(batches)) == ids_and_tokens(expected)
    if shape.mode is CPMode.STATIC and new_ranks % shape.size:
        with pytest.raises(MixflowError, match=rf"^--ranks {new_ranks} is not a multiple of {shape.size}: "):
            replay_cp_shape(shape, shape.ranks, CAPACITY, new_ranks, None)
        event("refused: static blocks")
        return
    new = replay_cp_shape(shape, shape.ranks, CAPACITY, new_ranks, None)
    assert new.micro_batches == default_micro_batches(shape.ranks, shape.micro_batches, new_ranks)
    lengths = np.fromiter((s.length for s in expected), np.int64, len(expected))
    if (cp_sizes(lengths, new, COST) == 0).any():
        with pytest.raises(ReshapeError, match=r"^step 3: sample \S+ of \d+ tokens fits no block of "):
            reshape_cp_step(batches, new, COST)
        event("refused: a sample longer than the new blocks hold")
        return
    found = read_step(batches)
    try:
        replanned = replan_cp_step(3, found, new, COST)
    except ReshapeError as exc:
        # Only where the new blocks can leave gaps a block cannot use: free blocks, or aligned ones over ranks not a
        # power of two, or blocks wider than the new shape's.
        gaps = shape.mode is CPMode.FREE or (shape.mode is CPMode.ALIGNED and new_ranks & (new_ranks - 1))
        assert gaps or int(found.size.max()) > new.size, exc
        assert re.fullmatch(
            r"step 3: its \d+ samples \(.*\) do not all fit in .*; give a larger --micro-batches", str(exc)
        )
        event("refused: no room left (gaps)")
        return
    reshaped = checked(reshape_cp_step(batches, new, COST))
    assert [(b.step, b.rank, b.ranks, b.mode, b.capacity) for b in reshaped] == [
        (3, r, new_ranks, shape.mode.value, CAPACITY) for r in range(new_ranks)
    ]
    assert sorted(ids_and_tokens(whole_samples(reshaped))) == sorted(ids_and_tokens(expected))
    # The constructor's planner over the new shape, called here directly on the samples in the same order.
    direct = plan_cp_step(lengths, new, COST)
    kept = direct.placed_mask
    assert values(reshaped) == values(build_cp_batches(3, replanned, expected))
    if kept.all():
        assert values(reshaped) == values(build_cp_batches(3, direct, expected))
        event("plan_cp_step placed all")
    elif ((replanned.rank == direct.rank) | ~kept).all():
        for name in ("rank", "cp", "micro"):
            np.testing.assert_array_equal(getattr(replanned, name)[kept], getattr(direct, name)[kept], err_msg=name)
        event("the rest placed after plan_cp_step")
    else:
        event("the original block micro-batches kept whole")
    _check_the_rest_placed(direct, lengths, rng)


def _check_the_rest_placed(plan: CPPlan, lengths: np.ndarray, rng: np.random.Generator) -> None:
    """The fallback on its own: ``plan`` with some of its samples deferred again places them where the mode
    allows, within every slot's room and the step's tokens, and leaves the others where they were."""
    placed = np.flatnonzero(plan.placed_mask)
    again = placed[rng.random(placed.size) < 0.5]
    rank, cp, micro = plan.rank.copy(), plan.cp.copy(), plan.micro.copy()
    rank[again], cp[again], micro[again] = -1, 0, -1
    filled = _place_the_rest(CPPlan(rank, cp, micro, plan.shape), lengths, COST)
    validate_cp_plan(filled, lengths)
    stayed = np.setdiff1d(placed, again)
    assert (filled.rank[stayed] == plan.rank[stayed]).all() and (filled.micro[stayed] == plan.micro[stayed]).all()
    event("the fallback placed all" if filled.placed_mask.all() else "the fallback left some (refused)")


@settings(deadline=None, max_examples=25)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=original_shapes((CPMode.STATIC, CPMode.ALIGNED)),
    new_ranks=st.sampled_from([1, 2, 4, 8, 16]),
    family=st.sampled_from(FAMILIES),
)
def test_the_original_block_micro_batches_kept_whole_fit_static_and_aligned_blocks(
    seed: int, shape: CPShape, new_ranks: int, family: str
) -> None:
    """The last fallback on its own: over a power of two of ranks at the default micro-batches, static and aligned
    blocks always take every original block micro-batch whole, each where the mode allows, in a slot of its own."""
    rng = np.random.default_rng(seed)
    batches = cp_step(rng, family, shape, int(rng.integers(1, 40)))
    found = read_step(batches)
    assume(shape.mode is CPMode.ALIGNED or new_ranks % shape.size == 0)
    new = replay_cp_shape(shape, shape.ranks, CAPACITY, new_ranks, None)
    assume(found.size.size and int(found.size.max()) <= new.size)
    lengths = np.array([s.length for s in found.samples])
    whole = _whole_block_micro_batches(found, lengths, new, COST)
    assert whole.placed_mask.all()
    validate_cp_plan(whole, lengths)
    before = np.stack([found.first, found.size, found.micro], axis=1)
    after = np.stack([whole.rank, whole.cp, whole.micro], axis=1)
    # Samples together before are together after, and apart before are apart after.
    same_before = (before[:, None] == before[None]).all(axis=2)
    np.testing.assert_array_equal(same_before, (after[:, None] == after[None]).all(axis=2))


@pytest.mark.parametrize(
    ("mode", "size", "ranks", "expected_size"),
    [("aligned", 8, 4, 4), ("aligned", 8, 6, 4), ("aligned", 4, 8, 4), ("free", 8, 6, 6), ("free", 3, 16, 3)],
)
def test_the_new_shape_keeps_the_spec_s_blocks_where_the_ranks_allow(
    mode: str, size: int, ranks: int, expected_size: int
) -> None:
    spec = CPShape(8, 2, 128, CPMode(mode), size, 5)
    new = replay_cp_shape(spec, 8, 128, ranks, None)
    assert (new.ranks, new.size, new.capacity) == (ranks, expected_size, 128)
    assert new.micro_batches == -(-16 // ranks) and new.max_micro_batches == -(-5 * new.micro_batches // 2)
    assert replay_cp_shape(spec, 8, 128, ranks, 7).micro_batches == 7


def test_a_static_job_needs_whole_blocks() -> None:
    spec = CPShape(8, 2, 128, CPMode.STATIC, 4)
    assert replay_cp_shape(spec, 8, 128, 12, None).size == 4
    for ranks in (2, 6, 10):
        with pytest.raises(MixflowError, match=rf"--ranks {ranks} is not a multiple of 4: .* block of 4 ranks$"):
            replay_cp_shape(spec, 8, 128, ranks, None)


# -- the audit of a context-parallel step -----------------------------------------------------------------------


def _messages(batches: list[CPBatch]) -> StepMessages:
    def message(batch: CPBatch) -> Message:
        key, value, headers = encode_batch(batch)
        return Message(
            topic=f"j.rank.{batch.rank}", partition=0, offset=batch.step, key=key, value=value, headers=headers
        )

    return StepMessages(batches[0].step, [message(b) for b in batches])


def _rows(batch: CPBatch, keep: np.ndarray) -> CPBatch:
    """``batch`` with only the rows ``keep`` (its micro-batches numbered again)."""
    records = batch.records.filter(pa.array(keep))
    micro = np.unique(records.column("micro_batch").to_numpy(), return_inverse=True)[1].astype(np.int32)
    records = records.set_column(2, "micro_batch", pa.array(micro, pa.int32()))
    return replace(batch, micro_batches=int(micro.max(initial=-1)) + 1, records=records)


def _split_step() -> tuple[list[CPBatch], str]:
    """A step of 4 ranks whose first sample spans a block of 2 or more, and that sample's id."""
    rng = np.random.default_rng(7)
    shape = CPShape(4, 2, CAPACITY, CPMode.ALIGNED, 4)
    samples = [Sample(f"a/{k}", "a", rng.integers(0, 99, n, dtype=np.int32)) for k, n in enumerate([200, 30, 90])]
    batches = build_cp_batches(5, plan_cp_step(np.array([200, 30, 90]), shape, COST), samples)
    assert max(int(b.cp_size.max(initial=0)) for b in batches) > 1
    return batches, "a/0"


def test_the_audit_tells_a_slice_missing_repeated_or_relabelled() -> None:
    batches, split = _split_step()
    new = replay_cp_shape(CPShape(4, 2, CAPACITY, CPMode.ALIGNED, 4), 4, CAPACITY, 8, None)
    reshaped = reshape_cp_step(batches, new, COST)
    assert same_samples(_messages(batches), _messages(reshaped)) is None
    last = max(b.rank for b in reshaped if split in b.sample_ids)
    missing = [_rows(b, np.array(b.sample_ids) != split) if b.rank == last else b for b in reshaped]
    assert same_samples(_messages(batches), _messages(missing)) == (
        f"step 5: sample {split} lacks the slices of rank {last} (and 0 more) of its block of "
        f"{last - min(b.rank for b in reshaped if split in b.sample_ids) + 1} ranks from rank "
        f"{min(b.rank for b in reshaped if split in b.sample_ids)}"
    )
    samples = whole_samples(batches)
    again = [*samples, next(s for s in samples if s.sample_id == split)]
    lengths = np.array([s.length for s in again])
    twice = build_cp_batches(5, plan_cp_step(lengths, CPShape(8, 2, CAPACITY, CPMode.ALIGNED, 4), COST), again)
    assert sum(split in b.sample_ids for b in twice) > sum(split in b.sample_ids for b in reshaped)
    said = same_samples(_messages(batches), _messages(twice)) or ""
    assert said.startswith(f"step 5: sample {split} is there twice ("), said
    with pytest.raises(SlicesError, match=r"^step 5: sample a/1's labels are not its next tokens$"):
        whole_samples([_relabelled(b, "a/1") for b in reshaped])
    lost = [_rows(b, np.array(b.sample_ids) != "a/1") for b in reshaped]
    assert (
        same_samples(_messages(batches), _messages(lost)) == "step 5: 1 samples of the original are missing, a/1 first"
    )


def _relabelled(batch: CPBatch, sample_id: str) -> CPBatch:
    """``batch`` with the first label of ``sample_id``'s slice changed, if it holds one."""
    if sample_id not in batch.sample_ids:
        return batch
    row = batch.sample_ids.index(sample_id)
    labels = batch.labels.copy()
    labels[batch.offsets[row]] += 1
    column = pa.ListArray.from_arrays(batch.records.column("labels").offsets, pa.array(labels, pa.int32()))
    return replace(batch, records=batch.records.set_column(4, "labels", column))
