"""``StepShape``: made from the spec's ``step`` section with one meaning for "no patch limit" (0), refused
when a field is out of range, and the part a job's rank topics fix (``written``, ``of_batch``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.planning.shape import StepShape
from pipeline.planning.step.spec_change import check_step_shape
from pipeline.spec import StepSpec
from tests.sink_support import random_batch
from topics.errors import MixflowError

step_specs = st.builds(
    StepSpec,
    ranks=st.integers(1, 4096),
    micro_batches=st.integers(1, 64),
    tokens_per_micro_batch=st.integers(1, 2**20),
    patches_per_micro_batch=st.none() | st.integers(1, 2**16),
)


@given(step_specs)
def test_a_shape_from_the_spec_has_its_fields_and_no_patch_limit_as_zero(spec: StepSpec) -> None:
    shape = StepShape.from_spec(spec)
    assert (shape.ranks, shape.micro_batches, shape.tokens_per_micro_batch) == (
        spec.ranks,
        spec.micro_batches,
        spec.tokens_per_micro_batch,
    )
    assert shape.patches_per_micro_batch == (spec.patches_per_micro_batch or 0)
    assert shape.tokens_per_step == spec.tokens_per_step
    assert shape == StepShape.from_spec(spec.model_copy()) and hash(shape) == hash(StepShape.from_spec(spec))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.ranks = 2  # type: ignore[misc]


@given(step_specs)
def test_the_written_part_drops_the_patch_budget_alone(spec: StepSpec) -> None:
    shape = StepShape.from_spec(spec)
    written = shape.written()
    assert written == dataclasses.replace(shape, patches_per_micro_batch=0) and written.written() == written
    check_step_shape(written, shape, "j")  # a resume may change the patch budget
    other = dataclasses.replace(shape, micro_batches=shape.micro_batches + 1)
    with pytest.raises(MixflowError, match=rf"step.micro_batches is {other.micro_batches} in the spec but"):
        check_step_shape(written, other, "j")


@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 4), st.integers(1, 300))
def test_a_batch_gives_the_written_part_of_its_step_s_shape(seed: int, ranks: int, micro: int, capacity: int) -> None:
    batch = random_batch(np.random.default_rng(seed), 5, ranks - 1, ranks, micro, capacity)
    assert StepShape.of_batch(batch) == StepShape(ranks, micro, capacity)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ((0, 1, 1), "ranks"),
        ((1, -1, 1), "micro_batches"),
        ((1, 1.5, 1), "micro_batches"),
        ((1, 1, 0), "tokens_per_micro_batch"),
        ((True, 1, 1), "ranks"),
        ((1, 1, 1, -1), "patches_per_micro_batch"),
        ((1, 1, 1, None), "patches_per_micro_batch"),
    ],
)
def test_a_field_out_of_range_is_refused_naming_it(fields: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be an integer >= [01], got "):
        StepShape(*fields)


def test_numpy_integers_are_taken_as_ints() -> None:
    shape = StepShape(np.int64(2), np.int32(3), np.int64(64), np.int64(0))
    assert shape == StepShape(2, 3, 64) and all(
        type(getattr(shape, name)) is int for name in ("ranks", "micro_batches", "tokens_per_micro_batch")
    )
