"""What a batch's media must satisfy (``Batch`` checks it when made or decoded): each item is a valid
``MediaItem``, its placeholder tokens lie inside its sample, in order and apart, all one token id, and no
micro-batch holds more patches than the batch's budget."""

from __future__ import annotations

import numpy as np

from topics.formats.media_column import MediaTable

MAX_ITEM_PATCHES = 2**40
"""Far above any image or clip (a 16k x 16k image at patch 14 has 1.3 M); keeps every sum exact in int64."""


def check_media(
    media: MediaTable,
    offsets: np.ndarray,
    tokens: np.ndarray,
    micro_batch: np.ndarray,
    micro_batches: int,
    patches_per_micro_batch: int | None,
) -> None:
    """``ValueError`` naming the row and item of the first problem. ``offsets`` int64 [rows + 1] into ``tokens``,
    ``micro_batch`` the row's micro-batch."""
    if media.row_offsets.size != offsets.size:
        msg = f"the media column has {media.row_offsets.size - 1} rows, the batch {offsets.size - 1}"
        raise ValueError(msg)
    lengths = np.diff(offsets)[media.row].tolist()
    if media.nulls:
        msg = f"the media column holds {media.nulls} nulls"
        raise ValueError(msg)
    for k in range(len(media)):
        item = media.item(k)
        try:
            item.check()
        except ValueError as exc:
            raise ValueError(f"{_where(media, k)}: {exc}") from None
        if item.token_offset + item.tokens > lengths[k] or item.patches > MAX_ITEM_PATCHES:
            msg = (
                f"{_where(media, k)}: its {item.tokens} placeholder tokens from {item.token_offset} run past the end "
                f"of its sample of {lengths[k]} tokens"
            )
            raise ValueError(msg)
    _check_placeholders(media, offsets, tokens)
    if patches_per_micro_batch is not None and len(media):
        per_micro_batch = np.bincount(micro_batch[media.row], weights=media.patches, minlength=micro_batches)
        if per_micro_batch.max() > patches_per_micro_batch:
            worst = int(per_micro_batch.argmax())
            msg = (
                f"micro-batch {worst} holds {int(per_micro_batch[worst])} patches, over the budget of "
                f"{patches_per_micro_batch} (mixflow.patches_per_micro_batch)"
            )
            raise ValueError(msg)


def _where(media: MediaTable, k: int) -> str:
    row = int(media.row[k])
    return f"row {row} media item {k - int(media.row_offsets[row])}"


def _check_placeholders(media: MediaTable, offsets: np.ndarray, tokens: np.ndarray) -> None:
    if not len(media):
        return
    start = media.ints["token_offset"]
    count = media.tokens
    # The next item of the same row starts at or after this one's last placeholder.
    same_row = media.row[1:] == media.row[:-1]
    overlapping = same_row & (start[1:] < start[:-1] + count[:-1])
    if overlapping.any():
        k = int(np.argmax(overlapping))
        msg = (
            f"{_where(media, k)}: its {int(count[k])} placeholder tokens from {int(start[k])} overlap the next "
            f"item's, from {int(start[k + 1])} (items are in placeholder order)"
        )
        raise ValueError(msg)
    first = offsets[media.row] + start
    positions = np.repeat(first, count) + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count))
    differs = tokens[positions] != np.repeat(tokens[first], count)
    if differs.any():
        k = int(np.searchsorted(np.cumsum(count), int(np.argmax(differs)), side="right"))
        msg = f"{_where(media, k)}: its placeholder tokens from {int(start[k])} are not all one token id"
        raise ValueError(msg)
