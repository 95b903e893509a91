"""Corpora as people store them, for the compressed-source tests: JSON lines (text with its token ids, blank
and broken lines), and the same bytes as gzip or zstd in the layouts real corpora ship: one stream, members
or frames cut anywhere (``cat`` of gzip files, bgzip, pzstd with its skippable size frames, the seekable-zstd
format with its seek table), empty members included; plus the ways such files break."""

from __future__ import annotations

import gzip
import itertools
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import Document, Reader
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter

FORMS = ("gzip", "gzip-members", "zstd", "zstd-frames", "pzstd", "zstd-seekable")
"""How a corpus is compressed: one gzip stream, gzip members, one zstd frame, zstd frames, pzstd's frames
(each after a skippable frame holding its size) and the seekable-zstd format (frames, then the seek table)."""
EXTENSIONS = {"gzip": ".gz", "zstd": ".zst"}
SINGLE_STREAM = frozenset({"gzip", "zstd"})
_SKIPPABLE = 0x184D2A50  # + 0..15: a zstd skippable frame's magic
_SEEKABLE_FOOTER = 0x8F92EAB1


def codec_of_form(form: str) -> str:
    return form.split("-")[0].replace("pzstd", "zstd")


@st.composite
def corpora(draw: st.DrawFn, max_rows: int = 60) -> bytes:
    """JSON lines whose objects hold ``text`` and its ``tokens`` (the text's UTF-8 bytes), some lines blank or
    not JSON, the last newline there or not."""
    lines = []
    for row in range(draw(st.integers(0, max_rows))):
        kind = draw(st.sampled_from(["doc"] * 8 + ["blank", "broken"]))
        if kind == "blank":
            lines.append(b"")
        elif kind == "broken":
            lines.append(b'{"text": "not closed')
        else:
            text = f"row {row} " + draw(st.text(st.characters(codec="utf-8"), max_size=120))
            lines.append(json.dumps({"text": text, "tokens": list(text.encode())}).encode())
    data = b"\n".join(lines)
    return data + b"\n" if lines and draw(st.booleans()) else data


def cut_points(data: bytes, fractions: list[float], aligned: bool) -> list[int]:
    """Where to cut ``data`` into members or frames: at the given fractions of it, moved to the next line's start
    when ``aligned`` (as ``cat`` of whole files does); repeats make empty members."""
    cuts = sorted(int(f * len(data)) for f in fractions)
    if aligned:
        ends = [i + 1 for i in range(len(data)) if data[i] == ord("\n")]
        cuts = [next((end for end in ends if end >= cut), len(data)) for cut in cuts]
    return cuts


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def compress(data: bytes, form: str, cuts: list[int] | None = None) -> bytes:
    """``data`` compressed in ``form`` (``FORMS``), cut at ``cuts`` where the form has several members or frames."""
    parts = pieces(data, cuts or [])
    if form == "gzip":
        return gzip.compress(data, mtime=0)
    if form == "gzip-members":
        return b"".join(gzip.compress(part, mtime=0) for part in parts)
    zstd = zstandard.ZstdCompressor(write_checksum=True)
    if form == "zstd":
        return zstd.compress(data)
    frames = [zstd.compress(part) for part in parts]
    if form == "zstd-frames":
        return b"".join(frames)
    if form == "pzstd":
        return b"".join(struct.pack("<III", _SKIPPABLE, 4, len(frame)) + frame for frame in frames)
    if form == "zstd-seekable":
        entries = b"".join(struct.pack("<II", len(frame), len(part)) for frame, part in zip(frames, parts, strict=True))
        table = entries + struct.pack("<IBI", len(frames), 0, _SEEKABLE_FOOTER)
        return b"".join(frames) + struct.pack("<II", _SKIPPABLE + 0xE, len(table)) + table
    raise ValueError(form)


def corrupt(stored: bytes, form: str, how: str) -> bytes:
    """``stored`` broken at its end: ``cut`` (its last bytes missing), ``garbage`` (bytes after its last frame
    that begin none), or ``bad-frame`` (its last gzip member's deflate data or zstd frame's magic overwritten)."""
    if how == "cut":
        return stored[: max(len(stored) - 7, 1)]
    if how == "garbage":
        return stored + b"this is not compressed\n"
    last = _last_frame(stored, codec_of_form(form))
    if codec_of_form(form) == "gzip":
        # 0xff: a final block of the reserved type 3, after the member's 10-byte header
        return stored[: last + 10] + b"\xff" * (len(stored) - last - 10)
    return stored[:last] + b"\x00\x00\x00\x00" + stored[last + 4 :]


def _last_frame(stored: bytes, codec: str) -> int:
    """Where the last frame holding data begins: found by decoding, frame by frame."""
    from connectors.compression import decode_frames

    last, reader = 0, iter([stored])
    for frame, data in decode_frames(lambda _: next(reader, b""), codec):  # type: ignore[arg-type]
        if data:
            last = frame
    return last


def byte_tokenizer(save_to: Path | None = None) -> TextTokenizer:
    """A byte-level tokenizer without merges, one token per byte, made in memory (and saved as ``save_to``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if save_to is not None:
        tokenizer.save(str(save_to))
    return TextTokenizer(tokenizer)


@dataclass(frozen=True)
class Read:
    """What a reader gave for a file, its path taken out: documents as (row, text or token tuple), dead letters
    as (location, reason), in order; and the samples built from the documents, as (id, tokens)."""

    items: list[tuple[object, ...]]
    samples: list[tuple[str, tuple[int, ...]]]


def units_of(reader: Reader, max_bytes: int) -> list[WorkUnit]:
    return [unit for layout in reader.layouts() for unit in split_file(reader.source, layout, max_bytes)]


def read_units(reader: Reader, units: list[WorkUnit], path: str, *, build: bool = True) -> Read:
    """The items of ``units`` in order, every mention of ``path`` replaced with ``FILE``; their samples unless
    ``build`` is false."""
    items: list[tuple[object, ...]] = []
    documents = []
    for item in _items(reader, units):
        if isinstance(item, DeadLetter):
            items.append(("dead", item.location.replace(path, "FILE"), item.reason.replace(path, "FILE")))
            continue
        documents.append(item)
        value = item.text if item.text is not None else tuple(np.asarray(item.tokens).tolist())
        items.append(("doc", item.row, value))
    if not build:
        return Read(items, [])
    built = SampleBuilder(None if documents and documents[0].tokens is not None else byte_tokenizer(), max_length=40)
    samples = [(s.sample_id.replace(path, "FILE"), tuple(s.tokens.tolist())) for s in built.build(documents).samples]
    return Read(items, samples)


def _items(reader: Reader, units: list[WorkUnit]) -> Iterator[Document | DeadLetter]:
    for unit in units:
        yield from reader.read(unit)
