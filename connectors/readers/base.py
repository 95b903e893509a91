"""What every reader shares: the file listing, the layout planning needs, and value checks."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ClassVar, Literal, get_args

import numpy as np

from connectors.compression import Codec, FrameIndex, codec_of
from connectors.sample_ids import document_id
from connectors.storage import ObjectInfo, Storage, glob_matches, storage_for
from connectors.storage.object_file import content_encoding
from connectors.work_units import WorkUnit
from topics.errors import MixflowError
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FileFormat, glob_alternatives
from topics.formats.media import MediaKind

ContentKind = Literal["text", "tokens", "media"]
CONTENT_KINDS: tuple[str, ...] = get_args(ContentKind)
TEXT_CONTENT: tuple[str, ...] = ("text", "tokens")
INT32_LIMIT = 2**31
# Objects whose layouts are read at once when planning a source in an object store (Parquet footers, say).
LAYOUT_THREADS = 16


class SourceNotFoundError(MixflowError, FileNotFoundError):
    """A source root that does not exist, or a glob that matches no file under it."""


@dataclass(frozen=True, slots=True)
class MediaRef:
    """An image or clip as a reader finds it, not yet decoded: its encoded bytes (``data``) or a file
    (``path``, relative to the source root), exactly one of them. ``where``: the location a dead letter
    names (``shard.tar:key=000001.jpg``, ``rows.jsonl:row=3:image=0``)."""

    kind: MediaKind
    where: str
    data: bytes | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.data is None) == (self.path is None):
            msg = f"media at {self.where} must have exactly one of data and path"
            raise ValueError(msg)


Part = str | MediaRef
"""One segment of an interleaved document: text, or an image or clip."""


@dataclass(frozen=True, slots=True)
class MediaFields:
    """The keys (JSON) or columns (Parquet, Arrow) of a multimodal record, each a list of names tried in order:
    the first present and non-null one is taken. The defaults follow Hugging Face ``datasets`` and LLaVA:
    ``{"image": ..., "text": ...}``, ``{"images": [...], "caption": ...}``, ``{"video": ...}``,
    ``{"segments": [{"text": ...}, {"image": ...}]}`` for an interleaved document, and LLaVA's
    ``{"image": ..., "conversations": [{"from": "human", "value": "<image>\\n..."}, ...]}`` or a
    ``{"messages": [{"role": "user", "content": ...}, ...]}`` for a conversation (``chat_parts``), and OBELICS'
    parallel lists ``{"images": [None, "a.jpg", None], "texts": ["Look:", None, "a cat"]}``."""

    text: tuple[str, ...] = ("text", "caption")
    image: tuple[str, ...] = ("image", "images")
    video: tuple[str, ...] = ("video", "videos")
    segments: tuple[str, ...] = ("segments",)
    conversations: tuple[str, ...] = ("conversations", "messages")
    texts: tuple[str, ...] = ("texts",)

    def __post_init__(self) -> None:
        names = [*self.text, *self.image, *self.video, *self.segments, *self.conversations, *self.texts]
        if not all(names) or len(set(names)) != len(names):
            msg = f"media field names must be non-empty and distinct, got {names}"
            raise ValueError(msg)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name, in the order above: the columns a multimodal reader reads."""
        return (*self.text, *self.image, *self.video, *self.segments, *self.conversations, *self.texts)


@dataclass(frozen=True, slots=True)
class Document:
    """One document read from a source: row ``row`` of file ``path`` (relative to the source root), with
    exactly one of ``text``, pre-tokenized ``tokens`` (int32), or ``parts``: text and media interleaved,
    in order (an image-text pair is ``(image, caption)``). ``where``: the location a dead letter about it
    names, as its reader's other letters do (``location``); ``<path>:row=<row>`` unless the reader says.
    ``trained``: the indices of the text parts whose tokens take the loss (a conversation's assistant turns);
    None when every token does."""

    source: str
    path: str
    row: int
    text: str | None = None
    tokens: np.ndarray | None = None
    parts: tuple[Part, ...] | None = None
    where: str = ""
    trained: frozenset[int] | None = None

    @property
    def document_id(self) -> str:
        """``<source>/<path>/<row>``: the sample id without the chunk and epoch suffixes."""
        return document_id(self.source, self.path, self.row)

    def __post_init__(self) -> None:
        if (self.text is not None) + (self.tokens is not None) + (self.parts is not None) != 1:
            msg = f"document {self.document_id} must have exactly one of text, tokens and parts"
            raise ValueError(msg)
        if not self.where:
            object.__setattr__(self, "where", location(self.path, row=self.row))


@dataclass(frozen=True, slots=True)
class FileLayout:
    """What planning needs to know about one file.

    ``row_bounds`` (int64, ``num_rows + 1`` entries) gives where each row's content starts and ends,
    in bytes: exact file offsets for line-based files, estimates elsewhere. ``row_groups``, when set,
    holds the row numbers where row groups start and end (``[0, 64, 128, 150]``), and the file can only
    be split there. ``problem`` is set when the file could not be inspected; it is then planned as one
    unit and reading it yields the dead letter. ``etag`` is an object's version in an object store (``""``
    on a local disk). ``rows_known`` is False for a small object planned from the listing alone, without
    reading it: one row spanning its bytes, read as one ``file`` unit. ``frames``, for a compressed file whose
    lines were counted: its gzip members or zstd frames, where units may start; ``row_bounds`` are then offsets
    in its decompressed bytes, and ``size_bytes`` its size as stored. ``group_offsets``, where set with
    ``row_groups``: the file offset where each row group begins (an Arrow record batch's message), a unit's
    ``byte_offset``.
    """

    path: str
    size_bytes: int
    row_bounds: np.ndarray
    row_groups: np.ndarray | None = None
    problem: str | None = None
    etag: str = ""
    rows_known: bool = True
    frames: FrameIndex | None = None
    group_offsets: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def content_bytes(self) -> int:
        return int(self.row_bounds[-1] - self.row_bounds[0])

    @classmethod
    def unreadable(cls, path: str, size_bytes: int, problem: str) -> FileLayout:
        return cls(path, size_bytes, np.zeros(1, dtype=np.int64), problem=problem)


def location(path: str, *, row: int | None = None, row_group: int | None = None, key: str | None = None) -> str:
    """Where a dead letter came from, one format for every reader: ``a/b.jsonl:row=3`` (a row, 0-based),
    ``c.parquet:row_group=2``, ``s.tar:key=000001`` (a WebDataset sample; ``key=000001.jpg`` one of its
    members) or ``d.txt`` (the whole file). A medium of a row adds ``:image=<i>`` or ``:video=<i>``."""
    if row is not None:
        return f"{path}:row={row}"
    if row_group is not None:
        return f"{path}:row_group={row_group}"
    if key is not None:
        return f"{path}:key={key}"
    return path


class Reader(ABC):
    """Reads the files of one source. A new format is one subclass with :meth:`layout` and :meth:`read`.

    ``glob`` selects files under ``root`` (``**`` recurses); ``field`` names the column or JSON key holding
    each document; ``content`` says whether it holds text or a list of token ids, or (``"media"``) text,
    images and clips in the keys or columns that ``media_fields`` names (``field`` is then not used).
    Nothing is read from disk until :meth:`files` is called.

    ``root`` is a local folder or ``s3://bucket/prefix``, read through ``storage`` (by default
    ``connectors.storage.storage_for(root)``); the paths, and so the sample ids, are the same either way.
    """

    file_format: ClassVar[FileFormat]
    """The format it reads (``topics.formats.file_formats``): its name and default glob."""
    supported_content: ClassVar[tuple[str, ...]] = TEXT_CONTENT

    def __init__(
        self,
        source: str,
        root: str | Path,
        glob: str | None = None,
        field: str = "text",
        *,
        content: ContentKind = "text",
        media_fields: MediaFields | None = None,
        storage: Storage | None = None,
    ) -> None:
        if not source or "/" in source:
            msg = f"source name {source!r} must be non-empty and hold no '/'"
            raise ValueError(msg)
        if content not in self.supported_content:
            kinds = ", ".join(self.supported_content)
            msg = f"content {content!r} of source {source} is not one of {kinds} for {type(self).__name__}"
            raise ValueError(msg)
        self.source = source
        self.root = Path(root)
        self.glob = glob or self.file_format.default_glob
        self.field = field
        self.content = content
        self.media_fields = media_fields or MediaFields()
        self.storage = storage or storage_for(root)
        self.objects: dict[str, ObjectInfo] = {}  # an object store's listing, as files() last read it

    def files(self) -> list[str]:
        """The matching files, relative to the root with '/' separators, sorted."""
        if self.storage.remote:
            return self._objects()
        if not self.root.is_dir():
            msg = f"source {self.source}: root {self.root} does not exist or is not a directory"
            raise SourceNotFoundError(msg)
        try:
            matches = {p for pattern in glob_alternatives(self.glob) for p in self.root.glob(pattern) if p.is_file()}
        except (ValueError, NotImplementedError) as exc:  # an absolute or malformed pattern
            msg = f"source {self.source}: glob {self.glob!r} is not a pattern relative to {self.root}: {exc}"
            raise ValueError(msg) from exc
        found = sorted(p.relative_to(self.root).as_posix() for p in matches)
        if not found:
            msg = f"source {self.source}: no file under {self.root} matches {self.glob!r}"
            raise SourceNotFoundError(msg)
        return found

    def _objects(self) -> list[str]:
        listed = [info for info in self.storage.list() if glob_matches(self.glob, info.path)]
        if not listed:
            msg = f"source {self.source}: no object under {self.storage.describe()} matches {self.glob!r}"
            raise SourceNotFoundError(msg)
        self.objects = {info.path: info for info in listed}
        return [info.path for info in listed]

    def layouts(self) -> list[FileLayout]:
        if not self.storage.remote:
            return [self.layout(path) for path in self.files()]
        paths = self.files()
        with ThreadPoolExecutor(LAYOUT_THREADS) as pool:
            return list(pool.map(self.object_layout, paths))

    def object_layout(self, path: str) -> FileLayout:
        """The layout of an object as listed, with its ETag: the version its units will read."""
        return dataclasses.replace(self.layout(path), etag=self.object_info(path).etag)

    def object_info(self, path: str) -> ObjectInfo:
        """Size and ETag of ``path``: as listed, or else as the store says now."""
        info = self.objects.get(path)
        if info is None:
            info = self.objects[path] = self.storage.info(path)
        return info

    def open_file(self, path: str, unit: WorkUnit | None = None, buffer_bytes: int = 1 << 20) -> BinaryIO:
        """``path`` opened for reading: a local file, or an object read by ranges, at the version ``unit``
        planned (or else the listed one), with at most ``buffer_bytes`` read ahead."""
        if not self.storage.remote:
            return self.full_path(path).open("rb")
        if unit is not None and unit.etag:
            return self.storage.open(path, unit.etag, size=unit.object_size, buffer_bytes=buffer_bytes)
        info = self.object_info(path)
        return self.storage.open(path, info.etag, size=info.size if info.etag else None, buffer_bytes=buffer_bytes)

    def codec(self, path: str, file: BinaryIO) -> Codec | None:
        """How ``path``'s bytes are compressed: by its name (``.gz``, ``.zst``, ``.zstd``), or else by the
        ``Content-Encoding`` its object store gives it, as the answer to ``file``'s first read says (a read made
        now, at ``file``'s position, unless one was made)."""
        return codec_of(path) or codec_of("", content_encoding(file))

    def size_of(self, path: str) -> int:
        return self.full_path(path).stat().st_size if not self.storage.remote else self.object_info(path).size

    @abstractmethod
    def layout(self, path: str) -> FileLayout:
        """Sizes and row boundaries of one file; a file that cannot be inspected gets
        :meth:`FileLayout.unreadable`, never an exception."""

    @abstractmethod
    def read(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        """The unit's documents in row order, with a dead letter in place of each bad record."""

    def full_path(self, path: str) -> Path:
        return self.root / path

    def check_unit(self, unit: WorkUnit) -> None:
        if unit.source != self.source:
            msg = f"work unit {unit.unit_id} belongs to source {unit.source}, not {self.source}"
            raise ValueError(msg)

    def dead_letter(self, where: str, reason: str, payload: bytes | None = None) -> DeadLetter:
        return DeadLetter(source=self.source, location=where, reason=reason, payload=payload)

    def unit_letter(
        self, unit: WorkUnit, where: str, reason: str, *, first: int | None = None, stop: int | None = None
    ) -> DeadLetter:
        """A dead letter for the rows ``[first, stop)`` of ``unit`` (by default from its first row to its end),
        none of which could be read: it names the unit and counts them, unless the plan did not count the
        unit's rows (a file that could not be inspected, or ``rows_known`` false)."""
        first = unit.start if first is None else first
        stop = unit.stop if stop is None else stop
        records = max(stop - first, 1) if self.unit_rows_known(unit) else None
        return DeadLetter(self.source, where, reason, records=records, unit=unit.unit_id)

    def unit_rows_known(self, unit: WorkUnit) -> bool:
        """Whether ``unit.start`` and ``unit.stop`` count its records: not for a file that could not be inspected
        when it was planned (planned as rows 0 to 0)."""
        return unit.stop > unit.start

    def document(self, path: str, row: int, value: object) -> Document | DeadLetter:
        """Check one record's field value against ``content`` and wrap it."""
        where = location(path, row=row)
        if value is None:
            return self.dead_letter(where, f"field {self.field!r} is missing or null")
        if self.content == "text":
            if not isinstance(value, str):
                return self.dead_letter(where, f"field {self.field!r} is {type(value).__name__}, not a string")
            return Document(self.source, path, row, text=value)
        tokens = token_array(value)
        if isinstance(tokens, str):
            return self.dead_letter(where, f"field {self.field!r} {tokens}")
        return Document(self.source, path, row, tokens=tokens)


def token_array(value: object) -> np.ndarray | str:
    """``value`` as a one-dimensional int32 array of token ids, or the reason it is not one."""
    if not isinstance(value, list | np.ndarray):
        return f"is {type(value).__name__}, not a list of token ids"
    if len(value) == 0:
        return np.zeros(0, dtype=np.int32)
    try:
        array = np.asarray(value)
    except ValueError as exc:
        return f"is not a flat list of token ids: {exc}"
    if array.ndim != 1 or array.dtype.kind not in "iu":
        return f"is not a flat list of integers (got {array.dtype} with {array.ndim} dimensions)"
    if int(array.min()) < 0 or int(array.max()) >= INT32_LIMIT:
        return "holds token ids outside [0, 2**31)"
    return array.astype(np.int32, copy=False)
