"""Context-parallel slices of a sample: which of its tokens each rank of its block holds (load-balanced causal
"zigzag" chunking, as Megatron-Core's ``get_batch_on_this_cp_rank`` and Transformer Engine's
``thd_get_partitioned_indices`` cut a sequence).

A sample of ``L`` tokens on a block of ``c`` ranks is padded to ``P``, the next multiple of ``2c``, and cut into
``2c`` chunks of ``P / 2c`` tokens; rank ``r`` of the block (``0 <= r < c``) holds chunks ``r`` and ``2c - 1 - r``,
in that order: ``P / c`` tokens, an early chunk and a late one, so that under a causal mask every rank attends
to about as many pairs. Positions past ``L`` are padding. ``c == 1``: the whole sample, unpadded.

Pure numpy: the constructor cuts with it, the sink and the tests read with it.
"""

from __future__ import annotations

import numpy as np

from topics.formats.loss_spans import IGNORE_INDEX, next_token_labels, target_mask


def padded_length(length: int, cp: int) -> int:
    """``length`` rounded up to a multiple of ``2 * cp`` (unchanged for ``cp == 1``)."""
    _check(length, cp, 0)
    return length if cp == 1 else -(-length // (2 * cp)) * 2 * cp


def slice_positions(length: int, cp: int, rank: int) -> np.ndarray:
    """The positions (0-based, in the padded sample) rank ``rank`` of the block holds, in the order it holds them
    (int64, ``padded_length / cp`` of them; those ``>= length`` are padding)."""
    _check(length, cp, rank)
    return zigzag_positions(np.array([length]), np.array([cp]), np.array([rank]))[0]


def zigzag_positions(lengths: np.ndarray, cp: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``slice_positions`` of many slices at once: every slice's positions concatenated (int64), and how many each
    holds (``padded_length / cp``; int64)."""
    length, c, r = (np.asarray(a, np.int64) for a in (lengths, cp, rank))
    unit = np.where(c > 1, 2 * c, 1)
    counts = (-(-length // unit) * unit) // c
    row = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    within = np.arange(int(counts.sum()), dtype=np.int64) - starts[row]
    c, r = c[row], r[row]
    chunk = counts[row] // np.where(c > 1, 2, 1)
    late = (c > 1) & (within >= chunk)
    return np.where(late, (2 * c - 1 - r) * chunk + within - chunk, r * chunk + within), counts


def slice_of(
    tokens: np.ndarray, cp: int, rank: int, pad: int = 0, loss_bounds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank ``rank``'s slice of a sample's ``tokens``: its tokens (``pad`` at padding), their labels (the next
    token of the sample where it is a target, by ``loss_bounds``, ``topics.formats.loss_spans``, every token
    where None; ``IGNORE_INDEX`` otherwise, at the sample's last token and at padding) and their positions."""
    tokens = np.asarray(tokens)
    positions = slice_positions(tokens.size, cp, rank)
    inside = positions < tokens.size
    out = np.full(positions.size, pad, dtype=tokens.dtype)
    out[inside] = tokens[positions[inside]]
    offsets = np.array([0, tokens.size])
    targets = None if loss_bounds is None else target_mask(offsets, np.array([0, len(loss_bounds)]), loss_bounds)
    whole = next_token_labels(tokens, offsets, targets)
    labels = np.full(positions.size, IGNORE_INDEX, dtype=np.int64)
    labels[inside] = whole[positions[inside]]
    return out, labels, positions


def reassemble(slices: list[np.ndarray], length: int) -> np.ndarray:
    """The sample's ``length`` tokens from the slices of every rank of its block, rank by rank (the inverse of
    ``slice_of``; padding dropped). Raises ValueError where the slices do not make one sample."""
    cp = len(slices)
    padded = padded_length(length, cp)
    if any(np.asarray(s).size != padded // cp for s in slices):
        msg = f"{cp} slices of a {length}-token sample must hold {padded // cp} tokens each"
        raise ValueError(msg)
    whole = np.empty(padded, dtype=np.asarray(slices[0]).dtype)
    for rank, part in enumerate(slices):
        whole[slice_positions(length, cp, rank)] = part
    return whole[:length]


def _check(length: int, cp: int, rank: int) -> None:
    if length < 1 or cp < 1 or not 0 <= rank < cp:
        msg = f"a slice needs length >= 1, cp >= 1 and 0 <= rank < cp, got {length}, {cp}, {rank}"
        raise ValueError(msg)
