"""The trees both planners search (``pipeline.planning.kernels.trees``) against brute force over random
keys with many ties and rooms of both kinds: every search answers the least key, and among equal keys the
lowest id."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.kernels.trees import (
    SlotRooms,
    first_fit,
    least_with_room,
    leftmost_above,
    new_min_tree,
    room_trees,
    set_key,
    set_leaf,
    update_rank,
)

KEYS = st.sampled_from([0.0, 1.0, 2.5, 7.0, np.inf])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 70), st.integers(1, 4), st.sampled_from([0, 6]), st.data())
def test_least_with_room_is_the_least_key_with_a_fitting_micro_batch_lowest_rank_first(
    ranks: int, micro: int, patch_capacity: int, data: st.DataObject
) -> None:
    """Both kinds of room: a rank fits where one of its micro-batches has room for the tokens and, with a patch
    capacity, the patches at once (its most free tokens and most free patches may be two micro-batches')."""
    capacity = 8
    key = data.draw(st.lists(KEYS.filter(np.isfinite), min_size=ranks, max_size=ranks))
    tokens = np.asarray(data.draw(st.lists(st.integers(0, capacity), min_size=ranks * micro, max_size=ranks * micro)))
    patches = np.asarray(
        data.draw(st.lists(st.integers(0, patch_capacity), min_size=ranks * micro, max_size=ranks * micro))
    )
    slots = SlotRooms(tokens.astype(np.int64), patches.astype(np.int64), micro, capacity, patch_capacity)
    trees = room_trees(np.asarray(key), slots)
    for _ in range(data.draw(st.integers(0, 12))):  # updates, as the planners make them between searches
        slot = data.draw(st.integers(0, ranks * micro - 1))
        r = slot // micro
        key[r] = data.draw(KEYS.filter(np.isfinite))
        slots.tokens[slot] = data.draw(st.integers(0, capacity))
        slots.patches[slot] = data.draw(st.integers(0, patch_capacity))
        update_rank(trees, slots, r, key[r])

    def fits(r: int, length: int, need: int) -> bool:
        return any(
            slots.tokens[r * micro + m] + length <= capacity
            and (patch_capacity == 0 or slots.patches[r * micro + m] + need <= patch_capacity)
            for m in range(micro)
        )

    for length in range(capacity + 2):
        for need in range(patch_capacity + 2 if patch_capacity else 1):
            fitting = [(key[r], r) for r in range(ranks) if fits(r, length, need)]
            got = least_with_room(trees, slots, np.int64(length), np.int64(need))
            assert got == (min(fitting)[1] if fitting else -1), (length, need)
            if got >= 0:
                m = first_fit(slots, got, np.int64(length), np.int64(need))
                assert m == min(m for m in range(micro) if fits_one(slots, got * micro + m, length, need))


def fits_one(slots: SlotRooms, slot: int, length: int, need: int) -> bool:
    return bool(
        slots.tokens[slot] + length <= slots.capacity
        and (slots.patch_capacity == 0 or slots.patches[slot] + need <= slots.patch_capacity)
    )


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.data())
def test_the_min_tree_root_is_the_least_key_lowest_id_first(size: int, data: st.DataObject) -> None:
    tree = new_min_tree(size)
    key = [np.inf] * size
    assert tree.keys[0] == np.inf
    for _ in range(data.draw(st.integers(1, 40))):
        item = data.draw(st.integers(0, size - 1))
        key[item] = data.draw(KEYS)
        set_key(tree, item, key[item])
        least = min(key)
        expected = key.index(least)
        assert tree.keys[0] == least
        if least < np.inf:  # with every key +inf the root holds some padding id
            assert tree.ids[0] == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 100), st.data())
def test_leftmost_above_is_the_first_position_from_start_above_the_threshold(size: int, data: st.DataObject) -> None:
    leaves = 1
    while leaves < size:
        leaves *= 2
    tree = np.full(2 * leaves, -1, np.int64)
    values = data.draw(st.lists(st.integers(-1, 9), min_size=size, max_size=size))
    for pos, value in enumerate(values):
        set_leaf(tree, leaves, pos, np.int64(value))
    start = data.draw(st.integers(0, size - 1))
    threshold = data.draw(st.integers(-1, 9))
    expected = next((p for p in range(start, size) if values[p] > threshold), -1)
    assert leftmost_above(tree, leaves, start, np.int64(threshold)) == expected
