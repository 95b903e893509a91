"""Which tokens of a sample are targets of the loss, and the labels that follow from them. Pure numpy.

A conversation's samples name their target tokens in the metadata key ``LOSS_SPANS_KEY``: ``start:stop`` ranges
of the sample's tokens, joined by commas (``""``: none); a sample without the key has every token a target. A
batch carries them as *bounds*: per sample, the flat list ``start0, stop0, start1, stop1, ...`` (ranges in
increasing order, none empty, none overlapping, within the sample); a sample without the key has ``0, length``.

Labels shift as Hugging Face's and LLaVA's do: the label of token ``i`` is token ``i + 1`` of the same sample
where token ``i + 1`` is a target, and ``IGNORE_INDEX`` otherwise (at a sample's last token always).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

IGNORE_INDEX = -100
"""The label of a token whose next token is not a target (PyTorch's cross-entropy default)."""

LOSS_SPANS_KEY = "mixflow.loss_spans"
"""A sample's metadata key naming its tokens that are targets of the loss (the module docstring)."""

LOSS_SPANS_FIELD = pa.field("loss_spans", pa.list_(pa.int32()), nullable=False)
"""A batch's column of each sample's target bounds (the module docstring)."""


_SPANS = re.compile(r"(?:[0-9]{1,9}:[0-9]{1,9}(?:,[0-9]{1,9}:[0-9]{1,9})*)?")


def parse_loss_spans(text: str, length: int) -> np.ndarray:
    """int32 bounds of a ``LOSS_SPANS_KEY`` value of a sample of ``length`` tokens; ValueError where it is not
    ``start:stop`` ranges, increasing, non-empty, apart and within the sample."""
    if not _SPANS.fullmatch(text):
        msg = f"{LOSS_SPANS_KEY} {text[:80]!r} is not start:stop ranges joined by commas"
        raise ValueError(msg)
    values = [int(v) for v in text.replace(":", ",").split(",")] if text else []
    previous = 0
    for start, stop in zip(values[::2], values[1::2], strict=True):
        problem = (
            "ranges out of order or overlapping" if start < previous
            else "an empty or reversed range" if start >= stop
            else "a range ends after the sample" if stop > length
            else ""
        )  # fmt: skip
        if problem:
            msg = f"{LOSS_SPANS_KEY} {text[:80]!r} of a {length}-token sample: {problem}"
            raise ValueError(msg)
        previous = stop
    return np.array(values, np.int32)


def format_loss_spans(bounds: np.ndarray) -> str:
    """The ``LOSS_SPANS_KEY`` value of ``bounds``."""
    flat = np.asarray(bounds).tolist()
    return ",".join(f"{a}:{b}" for a, b in zip(flat[::2], flat[1::2], strict=True))


def sample_bounds(metadata: dict[str, str], length: int) -> np.ndarray:
    """int32 bounds of a sample's targets from its metadata: every token where it has no ``LOSS_SPANS_KEY``."""
    text = metadata.get(LOSS_SPANS_KEY)
    if text is None:
        return np.array([0, length] if length else [], np.int32)
    return parse_loss_spans(text, length)


def rows_problem(bound_offsets: np.ndarray, bounds: np.ndarray, lengths: np.ndarray) -> tuple[int, str] | None:
    """The first row (and what is wrong) whose bounds ``bounds[bound_offsets[i]:bound_offsets[i + 1]]`` are not
    ranges of its ``lengths[i]`` tokens as the module docstring says; None when every row's are."""
    counts = np.diff(bound_offsets)
    if (odd := np.flatnonzero(counts % 2)).size:
        return int(odd[0]), "an odd number of bounds"
    bounds = np.asarray(bounds, np.int64)
    row = np.repeat(np.arange(counts.size), counts)[::2]
    starts, stops = bounds[::2], bounds[1::2]
    same_row = row[1:] == row[:-1]
    checks = (
        (starts < 0, "a range starts before the sample"),
        (stops > lengths[row], "a range ends after the sample"),
        (starts >= stops, "an empty or reversed range"),
    )
    for bad, what in checks:
        if bad.any():
            return int(row[np.argmax(bad)]), what
    overlap = np.zeros(row.size, bool)
    overlap[1:] = same_row & (starts[1:] < stops[:-1])
    if overlap.any():
        return int(row[np.argmax(overlap)]), "ranges out of order or overlapping"
    return None


def target_mask(offsets: np.ndarray, bound_offsets: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """bool [offsets[-1]]: whether each token of the samples laid end to end (sample ``i`` at
    ``offsets[i]:offsets[i + 1]``) is a target, by each sample's bounds."""
    total = int(offsets[-1])
    counts = np.diff(np.asarray(bound_offsets, np.int64)).astype(np.int64) // 2
    base = np.repeat(np.asarray(offsets[:-1], np.int64), counts)
    bounds = np.asarray(bounds, np.int64)
    # +1 where a range starts, -1 where it ends: the running sum is 1 inside a range, 0 outside.
    delta = np.bincount(base + bounds[::2], minlength=total + 1) - np.bincount(base + bounds[1::2], minlength=total + 1)
    return np.cumsum(delta[:total]) > 0


def next_token_labels(tokens: np.ndarray, offsets: np.ndarray, targets: np.ndarray | None) -> np.ndarray:
    """int64 labels of the samples laid end to end: token ``i``'s is token ``i + 1`` of its sample where that
    is a target (``targets``; None: every token), ``IGNORE_INDEX`` otherwise."""
    offsets = np.asarray(offsets, np.int64)
    labels = np.empty(tokens.size, np.int64)
    labels[:-1] = tokens[1:]
    if targets is not None and tokens.size:
        labels[:-1][~targets[1:]] = IGNORE_INDEX
    lengths = np.diff(offsets)
    labels[offsets[1:][lengths > 0] - 1] = IGNORE_INDEX
    return labels


def bounds_from_labels(labels: np.ndarray) -> np.ndarray:
    """int32 bounds of the targets one sample's ``labels`` name (token ``p >= 1`` where label ``p - 1`` is not
    ``IGNORE_INDEX``): the labels they give are ``labels`` again."""
    labels = np.asarray(labels)
    targets = np.zeros(labels.size + 2, bool)  # a False either side of the sample's tokens
    targets[2:-1] = labels[:-1] != IGNORE_INDEX
    return np.flatnonzero(np.diff(targets.astype(np.int8))).astype(np.int32)
