"""Samples from interleaved documents: text tokens and the placeholder blocks of their images and clips,
split into chunks only between blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from connectors.media.decode import MediaDecoder
from connectors.media.errors import MediaError
from connectors.media.placeholders import placeholder_block
from connectors.readers.base import Document, MediaRef
from connectors.sample_ids import with_suffixes
from topics.formats.dead_letter import DeadLetter
from topics.formats.loss_spans import LOSS_SPANS_KEY
from topics.formats.media import MediaItem
from topics.formats.sample import Sample


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of text tokens (``item`` None), which a chunk boundary may cut, or one item's placeholder
    block, which it may not."""

    tokens: np.ndarray
    item: MediaItem | None = None


@dataclass(slots=True)
class _Chunk:
    pieces: list[np.ndarray]
    items: list[MediaItem]
    length: int = 0
    patches: int = 0

    def add(self, tokens: np.ndarray, item: MediaItem | None = None) -> None:
        if item is not None:
            self.items.append(replace(item, token_offset=self.length + 1))
            self.patches += item.patches
        self.pieces.append(tokens)
        self.length += len(tokens)


def chunk_segments(
    segments: Sequence[Segment], max_length: int, max_patches: int | None = None
) -> list[tuple[np.ndarray, tuple[MediaItem, ...]]]:
    """Greedy chunks of at most ``max_length`` tokens and ``max_patches`` vision patches, laid end to end:
    text fills a chunk to the brim, a block that does not fit in what is left starts the next chunk. Each
    chunk's items carry offsets within it. ``ValueError`` for a block longer than ``max_length`` or with more
    patches than ``max_patches`` on its own."""
    chunks: list[_Chunk] = []
    current = _Chunk([], [])
    patch_limit = max_patches if max_patches is not None else np.iinfo(np.int64).max
    for segment in segments:
        tokens = segment.tokens
        if segment.item is not None:
            if len(tokens) > max_length:
                msg = f"a block of {len(tokens)} tokens does not fit in chunks of {max_length}"
                raise ValueError(msg)
            if segment.item.patches > patch_limit:
                msg = f"a block of {segment.item.patches} patches does not fit in chunks of {patch_limit}"
                raise ValueError(msg)
            if current.length + len(tokens) > max_length or current.patches + segment.item.patches > patch_limit:
                chunks.append(current)
                current = _Chunk([], [])
            current.add(tokens, segment.item)
            continue
        start = 0
        while start < len(tokens):
            if current.length == max_length:
                chunks.append(current)
                current = _Chunk([], [])
            stop = start + max_length - current.length
            current.add(tokens[start:stop])
            start = stop
    chunks.append(current)
    return [
        (np.concatenate([np.zeros(0, np.int32), *chunk.pieces]).astype(np.int32, copy=False), tuple(chunk.items))
        for chunk in chunks
        if chunk.length
    ]


def chunk_loss_spans(document: Document, segments: Sequence[Segment], lengths: Sequence[int]) -> list[str] | None:
    """Each chunk's ``LOSS_SPANS_KEY`` value, the chunks of ``lengths`` tokens laid end to end over the
    document's ``segments``: the tokens of its trained text parts (``Document.trained``), and the
    end-of-document token after a trained last part; None when the document does not say (every token)."""
    if document.trained is None:
        return None
    parts = len(document.parts or ())
    # segments follow the parts one for one; the end-of-document segment, when there is one, comes last
    trained = [k in document.trained for k in range(parts)]
    trained += [parts - 1 in document.trained] * (len(segments) - parts)
    flags = [np.full(len(segment.tokens), learn, dtype=bool) for segment, learn in zip(segments, trained, strict=True)]
    mask = np.concatenate([np.zeros(0, bool), *flags])
    spans, start = [], 0
    for length in lengths:
        edges = np.flatnonzero(
            np.diff(np.concatenate([[False], mask[start : start + length], [False]]).astype(np.int8))
        )
        spans.append(",".join(f"{a}:{b}" for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True)))
        start += length
    return spans


class InterleavedBuilder:
    """Samples of one interleaved document (``Document.parts``) whose text parts are already tokenized.

    Each media reference is decoded with ``decoder`` and stands in the tokens as its placeholder block
    (``connectors.media.placeholders``); ``eod_id``, when given, ends the document. A document whose media
    fails to decode, or holds a block longer than ``max_length`` or with more patches than ``max_patches`` (a
    micro-batch's patch budget; chunks hold at most that many), becomes one dead letter naming the
    reference's location, and none of its samples are built."""

    def __init__(
        self, decoder: MediaDecoder | None, *, max_length: int, eod_id: int | None, max_patches: int | None = None
    ) -> None:
        self.decoder = decoder
        self.max_length = max_length
        self.max_patches = max_patches
        self.eod_id = eod_id

    def build(
        self, document: Document, text_tokens: Sequence[np.ndarray], *, epoch: int = 0
    ) -> list[Sample] | DeadLetter:
        """``text_tokens``: one array per text part, in order."""
        segments = self.segments(document, text_tokens)
        if isinstance(segments, DeadLetter):
            return segments
        if not any(len(segment.tokens) for segment in segments):
            return DeadLetter(document.source, document.where, "document has no tokens")
        chunks = chunk_segments(segments, self.max_length, self.max_patches)
        split = len(chunks) > 1
        spans = chunk_loss_spans(document, segments, [len(tokens) for tokens, _ in chunks])
        return [
            Sample(
                sample_id=with_suffixes(document.document_id, chunk=k if split else None, epoch=epoch),
                source=document.source,
                tokens=tokens,
                metadata={} if spans is None else {LOSS_SPANS_KEY: spans[k]},
                media=items,
            )
            for k, (tokens, items) in enumerate(chunks)
        ]

    def segments(self, document: Document, text_tokens: Sequence[np.ndarray]) -> list[Segment] | DeadLetter:
        """The document's segments, its media decoded, the end-of-document token last; or the dead letter of
        the first reference that fails."""
        texts = iter(text_tokens)
        segments = []
        for k, part in enumerate(document.parts or ()):
            if not isinstance(part, MediaRef):
                tokens = next(texts)
                if reason := self._stray_vision_token(tokens):
                    where = document.where
                    return DeadLetter(document.source, where, f"text part {k} {reason}")
                segments.append(Segment(tokens))
                continue
            try:
                item = self._decode(part)
            except MediaError as exc:
                return DeadLetter.from_exception(document.source, part.where, exc)
            segments.append(Segment(placeholder_block(item, self.decoder.config), item))  # type: ignore[union-attr]
        if self.eod_id is not None:
            segments.append(Segment(np.array([self.eod_id], dtype=np.int32)))
        return segments

    def _stray_vision_token(self, tokens: np.ndarray) -> str | None:
        """Why a text's tokens cannot stand beside placeholder blocks: a vision token in them would pair
        with no item (a text holding ``<|vision_start|>`` or ``<|image_pad|>`` literally)."""
        if self.decoder is None or not len(tokens):
            return None
        config = self.decoder.config
        names = ("image_token_id", "video_token_id", "vision_start_id", "vision_end_id")
        ids = np.array([getattr(config, name) for name in names], dtype=np.int32)
        found = np.isin(ids, tokens)
        if not found.any():
            return None
        name = names[int(np.argmax(found))]
        return f"holds the vision token {getattr(config, name)} ({name}); only media may place vision tokens"

    def _decode(self, ref: MediaRef) -> MediaItem:
        if self.decoder is None:
            msg = f"{ref.kind} at {ref.where}: the source has media but no vision configuration"
            raise ValueError(msg)
        item = self.decoder.decode(ref)
        if item.tokens + 2 > self.max_length:
            msg = f"{ref.kind} needs {item.tokens + 2} tokens, more than max_sample_length {self.max_length}"
            raise MediaError(msg)
        if self.max_patches is not None and item.patches > self.max_patches:
            msg = f"{ref.kind} has {item.patches} patches, more than patches_per_micro_batch {self.max_patches}"
            raise MediaError(msg)
        return item
