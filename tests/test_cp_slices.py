"""Context-parallel slices (``topics.formats.cp_slices``): every sample comes back exactly from its slices
across its block, for every block size and for odd lengths; each rank's slice is the one Megatron-Core's own
``get_batch_on_this_cp_rank`` cuts from the padded sample."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.formats.cp_slices import IGNORE_INDEX, padded_length, reassemble, slice_of, slice_positions


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 700), st.integers(1, 24), st.integers(0, 2**31 - 1))
def test_a_sample_comes_back_exactly_from_its_slices(length: int, cp: int, seed: int) -> None:
    tokens = np.random.default_rng(seed).integers(0, 50_000, length, dtype=np.int32)
    padded = padded_length(length, cp)
    assert padded >= length and padded % (2 * cp if cp > 1 else 1) == 0 and padded - length < 2 * cp
    parts = [slice_of(tokens, cp, rank, pad=7) for rank in range(cp)]
    assert all(part[0].size == padded // cp for part in parts)
    np.testing.assert_array_equal(reassemble([part[0] for part in parts], length), tokens)
    positions = np.concatenate([part[2] for part in parts])
    assert sorted(positions.tolist()) == list(range(padded)), "every position is held once"
    for held, labels, where in parts:
        inside = where < length
        assert (held[~inside] == 7).all() and (labels[~inside] == IGNORE_INDEX).all()
        last = where == length - 1
        assert (labels[last] == IGNORE_INDEX).all()
        before = inside & ~last
        np.testing.assert_array_equal(labels[before], tokens[where[before] + 1])


@pytest.mark.parametrize("length", [1, 7, 8, 33, 128, 1001])
def test_rank_r_holds_chunks_r_and_2c_minus_1_minus_r(length: int) -> None:
    cp = 4
    chunk = padded_length(length, cp) // (2 * cp)
    for rank in range(cp):
        positions = slice_positions(length, cp, rank)
        assert positions[:chunk].tolist() == list(range(rank * chunk, (rank + 1) * chunk))
        assert positions[chunk:].tolist() == list(range((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk))


class _Group:
    """A context-parallel group as Megatron-Core asks one (its size and this process's rank in it)."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@pytest.fixture(scope="module")
def one_process_group() -> Iterator[None]:
    """A default process group of one for the module, destroyed after it: a group left behind is inherited by
    the processes later tests on this worker fork, which then cannot make their own."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("length", [5, 64, 999])
def test_each_slice_is_the_one_megatron_core_cuts(one_process_group: None, cp: int, length: int) -> None:
    from megatron.core.utils import get_batch_on_this_cp_rank

    tokens = np.random.default_rng([cp, length]).integers(0, 32_000, length, dtype=np.int64)
    padded = padded_length(length, cp)
    whole = np.zeros(padded, np.int64)
    whole[:length] = tokens
    labels = np.full(padded, IGNORE_INDEX, np.int64)
    labels[: length - 1] = tokens[1:]
    for rank in range(cp):
        batch = {
            "tokens": torch.from_numpy(whole.copy())[None],
            "labels": torch.from_numpy(labels.copy())[None],
            "position_ids": torch.arange(padded)[None],
        }
        cut = get_batch_on_this_cp_rank(batch, cp_group=_Group(cp, rank))
        mine, my_labels, my_positions = slice_of(tokens, cp, rank, pad=0)
        np.testing.assert_array_equal(cut["tokens"][0].numpy(), mine)
        np.testing.assert_array_equal(cut["labels"][0].numpy(), my_labels)
        np.testing.assert_array_equal(cut["position_ids"][0].numpy(), my_positions)
