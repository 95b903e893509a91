"""The first records of a few of a source's files, read as its loaders read them, and the size of each image and
clip in them measured without decoding a pixel: what `spec check --files` holds the source's settings to.

Of a source's files (in listing order) the first, the last and some evenly between, ``FILES_SAMPLED`` in all,
and of each its first ``RECORDS_PER_FILE`` records. An image's grid comes from its header (Pillow opens
lazily), a clip's from its stream's frame size and its packets' times (demuxed, not decoded).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from connectors import WorkUnit
from connectors.media.decode import MediaDecoder
from connectors.media.errors import MediaError
from connectors.readers import Document, MediaRef, Reader
from topics.formats.dead_letter import DeadLetter

FILES_SAMPLED = 4
RECORDS_PER_FILE = 16
SAMPLE_READ_AHEAD = 1 << 20  # bytes a line-based object's sample is read by


@dataclass(frozen=True)
class MeasuredItem:
    """An image or clip as its loader would cut it: ``patches`` of the encoder, ``block`` tokens in the text
    (its placeholders and the start and end tokens)."""

    where: str
    kind: str
    patches: int
    block: int

    @property
    def noun(self) -> str:
        return "clip" if self.kind == "video" else "image"


@dataclass
class RecordSample:
    """What was read of a source: ``records`` read from ``files`` of its ``listed`` files, of which
    ``documents`` became documents; the first dead letter; the media measured (``unreadable`` could not be)."""

    listed: int
    files: int = 0
    records: int = 0
    documents: int = 0
    first_dead_letter: DeadLetter | None = None
    items: list[MeasuredItem] = field(default_factory=list)
    unreadable: int = 0

    def largest(self, kind: str | None = None, *, by: str = "patches") -> MeasuredItem | None:
        """The sampled item (of ``kind``, if given) with the most patches, or with ``by="block"`` the longest."""
        items = [item for item in self.items if kind is None or item.kind == kind]
        return max(items, key=lambda item: getattr(item, by), default=None)

    def describe(self) -> str:
        """``64 records of 4 of 9 files; largest image 256 patches, 66 tokens``: the largest of its kind by
        patches (an item's block of tokens grows with its patches)."""
        text = f"{self.records} records of {self.files} of {self.listed} file{'s' if self.listed != 1 else ''}"
        for kind in ("image", "video"):
            if (item := self.largest(kind)) is not None:
                text += f"; largest {item.noun} {item.patches} patches, {item.block} tokens"
        if self.unreadable:
            text += f"; {self.unreadable} media not readable (dead letters when read)"
        return text


def sampled_files(files: list[str], count: int = FILES_SAMPLED) -> list[str]:
    """Up to ``count`` of ``files``: the first, the last and the rest evenly between, in order, none twice."""
    if len(files) <= count:
        return list(files)
    picks = np.unique(np.round(np.linspace(0, len(files) - 1, count)).astype(int))
    return [files[k] for k in picks]


def sample_records(reader: Reader, files: list[str], decoder: MediaDecoder | None) -> RecordSample:
    """The first ``RECORDS_PER_FILE`` records of ``sampled_files(files)``, their media measured with ``decoder``
    (a multimodal source's; None for text)."""
    sample = RecordSample(listed=len(files))
    for path in sampled_files(files):
        sample.files += 1
        # The file's first rows as a unit of its own: an object store's reader fetches only their bytes (a
        # Parquet file's first row group), and a shorter file says so in a letter naming the unit, not a record.
        unit = WorkUnit(reader.source, path, "rows", 0, RECORDS_PER_FILE, estimated_bytes=SAMPLE_READ_AHEAD)
        records = reader.read(unit)
        with contextlib.closing(records):  # stops reading the file at once
            for record in records:
                if isinstance(record, DeadLetter) and unit.unit_id in record.reason:
                    break  # the file ends before the sample's last row
                sample.records += 1
                if isinstance(record, DeadLetter):
                    sample.first_dead_letter = sample.first_dead_letter or record
                    continue
                sample.documents += 1
                if decoder is not None:
                    _measure(record, decoder, sample)
    return sample


def _measure(document: Document, decoder: MediaDecoder, sample: RecordSample) -> None:
    merge = decoder.config.merge_size
    for part in document.parts or ():
        if not isinstance(part, MediaRef):
            continue
        try:
            t, h, w = decoder.grid(part)
        except MediaError:
            sample.unreadable += 1
            continue
        patches = t * h * w
        sample.items.append(MeasuredItem(part.where, part.kind, patches, patches // (merge * merge) + 2))
