"""The trees both planners search (``pipeline.planning.kernels.trees``) against brute force over random
keys with many ties: every search answers the least key, and among equal keys the lowest id."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.kernels.trees import (
    least_with_room,
    leftmost_above,
    new_min_tree,
    rank_trees,
    set_key,
    set_leaf,
    update_rank,
)

KEYS = st.sampled_from([0.0, 1.0, 2.5, 7.0, np.inf])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 70), st.data())
def test_least_with_room_is_the_least_key_with_room_lowest_rank_first(ranks: int, data: st.DataObject) -> None:
    key = data.draw(st.lists(KEYS.filter(np.isfinite), min_size=ranks, max_size=ranks))
    room = data.draw(st.lists(st.integers(0, 8), min_size=ranks, max_size=ranks))
    trees = rank_trees(np.asarray(key), np.asarray(room, dtype=np.int64))
    for _ in range(data.draw(st.integers(0, 12))):  # updates, as the planners make them between searches
        r = data.draw(st.integers(0, ranks - 1))
        key[r], room[r] = data.draw(KEYS.filter(np.isfinite)), data.draw(st.integers(0, 8))
        update_rank(trees, r, key[r], np.int64(room[r]))
    for length in range(10):
        fits = [(key[r], r) for r in range(ranks) if room[r] >= length]
        assert least_with_room(trees, np.int64(length)) == (min(fits)[1] if fits else -1)


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
