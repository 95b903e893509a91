"""Turning documents into samples: tokenize, append the end-of-document token, split long ones."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from connectors.media.config import VisionConfig
from connectors.readers.base import Document
from connectors.sample_ids import with_suffixes
from connectors.storage import Storage
from connectors.tokenizer import TextTokenizer
from topics.formats.dead_letter import DeadLetter
from topics.formats.sample import Sample

if TYPE_CHECKING:
    from connectors.multimodal_samples import InterleavedBuilder


class Built(NamedTuple):
    samples: list[Sample]
    dead_letters: list[DeadLetter]


def chunk_bounds(lengths: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Chunks of at most ``max_length`` tokens for documents of ``lengths`` laid end to end.

    Returns, one entry per chunk: the document index, the chunk number within the document, and the
    chunk's start and stop in the concatenated tokens. A document of length 0 has no chunk."""
    lengths = lengths.astype(np.int64)
    counts = -(-lengths // max_length)  # ceil division
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    doc = np.repeat(np.arange(len(lengths)), counts)
    first_chunk = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    chunk = np.arange(len(doc)) - first_chunk[doc]
    start = doc_starts[doc] + chunk * max_length
    stop = np.minimum(start + max_length, doc_starts[doc] + lengths[doc])
    return doc, chunk, start, stop


class SampleBuilder:
    """Builds samples of at most ``max_length`` tokens from documents.

    Texts are tokenized with ``tokenizer`` in one batch; pre-tokenized documents skip it. ``eod_id``, when
    given, is appended to every document before it is split. A document split into several chunks gets
    ``#<k>`` ids; epochs after the first get ``@e<n>``.

    Interleaved documents (``Document.parts``) have their text parts tokenized in the same batch and their
    media decoded per ``vision`` (path references under ``media_root``: a folder, or a ``Storage``), and are
    split only between placeholder blocks (``connectors.multimodal_samples``); a bad image or clip makes its
    document a dead letter."""

    def __init__(
        self,
        tokenizer: TextTokenizer | None,
        *,
        max_length: int,
        eod_id: int | None = None,
        vision: VisionConfig | None = None,
        media_root: str | Path | Storage | None = None,
        max_patches: int | None = None,
    ) -> None:
        if max_length < 1:
            msg = f"max_length must be >= 1, got {max_length}"
            raise ValueError(msg)
        if eod_id is not None and not 0 <= eod_id < 2**31:
            msg = f"eod_id must be in [0, 2**31), got {eod_id}"
            raise ValueError(msg)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.eod_id = eod_id
        self.vision = vision
        self.media_root = media_root
        self.max_patches = max_patches
        self._interleaved: InterleavedBuilder | None = None

    def token_arrays(self, documents: Sequence[Document]) -> list[np.ndarray]:
        """Each document's tokens (int32), without the end-of-document token."""
        texts = [doc.text for doc in documents if doc.tokens is None]
        encoded = iter(self._encode(texts, documents))
        return [next(encoded) if doc.tokens is None else doc.tokens for doc in documents]

    def _encode(self, texts: list[str], documents: Sequence[Document]) -> list[np.ndarray]:
        if texts and self.tokenizer is None:
            msg = f"document {documents[0].document_id}: text needs a tokenizer, but none is configured"
            raise ValueError(msg)
        return self.tokenizer.encode_batch(texts) if texts else []  # type: ignore[union-attr]

    def build(self, documents: Sequence[Document], *, epoch: int = 0) -> Built:
        """Samples in document order; a document with no tokens at all becomes a dead letter."""
        if any(document.parts is not None for document in documents):
            return self._build_interleaved(documents, epoch)
        samples, _, empty = self._build_flat(documents, self.token_arrays(documents), epoch)
        return Built(samples, [_no_tokens(documents[i]) for i in empty])

    def _build_flat(
        self, documents: Sequence[Document], arrays: list[np.ndarray], epoch: int
    ) -> tuple[list[Sample], list[int], list[int]]:
        """The samples of documents of text or tokens, each sample's document index, the empty documents'."""
        if self.eod_id is not None:
            eod = np.array([self.eod_id], dtype=np.int32)
            arrays = [part for tokens in arrays for part in (tokens, eod)]
            lengths = np.array([len(a) for a in arrays[::2]], dtype=np.int64) + 1
        else:
            lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        flat = np.concatenate([np.zeros(0, dtype=np.int32), *arrays]).astype(np.int32, copy=False)
        doc, chunk, start, stop = chunk_bounds(lengths, self.max_length)
        split = lengths > self.max_length
        samples = []
        for d, k, lo, hi in zip(doc.tolist(), chunk.tolist(), start.tolist(), stop.tolist(), strict=True):
            document = documents[d]
            sample_id = with_suffixes(document.document_id, chunk=k if split[d] else None, epoch=epoch)
            samples.append(Sample(sample_id=sample_id, source=document.source, tokens=flat[lo:hi]))
        return samples, doc.tolist(), np.flatnonzero(lengths == 0).tolist()

    def _build_interleaved(self, documents: Sequence[Document], epoch: int) -> Built:
        """A batch with interleaved documents: every text (documents' and parts') tokenized in one call."""
        encoded = iter(self._encode([text for doc in documents for text in _texts(doc)], documents))
        outcomes: list[list[Sample] | DeadLetter] = [[] for _ in documents]
        flat: list[int] = []  # the documents of text or tokens, built together as without media
        flat_arrays: list[np.ndarray] = []
        for i, doc in enumerate(documents):
            texts = [next(encoded) for _ in _texts(doc)]
            if doc.parts is not None:
                outcomes[i] = self._interleaved_builder().build(doc, texts, epoch=epoch)
            else:
                flat.append(i)
                flat_arrays.append(texts[0] if doc.tokens is None else doc.tokens)
        samples, sample_docs, empty = self._build_flat([documents[i] for i in flat], flat_arrays, epoch)
        for sample, d in zip(samples, sample_docs, strict=True):
            outcomes[flat[d]].append(sample)  # type: ignore[union-attr]
        for d in empty:
            outcomes[flat[d]] = _no_tokens(documents[flat[d]])
        letters = [outcome for outcome in outcomes if isinstance(outcome, DeadLetter)]
        return Built([s for outcome in outcomes if isinstance(outcome, list) for s in outcome], letters)

    def _interleaved_builder(self) -> InterleavedBuilder:
        if self._interleaved is None:
            from connectors.media.decode import MediaDecoder
            from connectors.multimodal_samples import InterleavedBuilder

            decoder = None if self.vision is None else MediaDecoder(self.vision, self.media_root)
            self._interleaved = InterleavedBuilder(
                decoder, max_length=self.max_length, eod_id=self.eod_id, max_patches=self.max_patches
            )
        return self._interleaved


def _texts(document: Document) -> list[str]:
    """The texts of ``document`` to tokenize: its text, or its text parts; none for pre-tokenized ones."""
    if document.parts is not None:
        return [part for part in document.parts if isinstance(part, str)]
    return [] if document.tokens is not None else [document.text]  # type: ignore[list-item]


def _no_tokens(document: Document) -> DeadLetter:
    return DeadLetter(document.source, document.where, "document has no tokens")
