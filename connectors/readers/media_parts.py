"""A multimodal record (a JSON object, a Parquet or Arrow row, a WebDataset key's ``.json``) as a document's parts.

Four forms, told apart by whether the record has a conversations field, a texts field, then a segments field
(``MediaFields``):

* a conversation (LLaVA's ``conversations``, ``messages``): its turns rendered, its media at their
  placeholders, the loss on the assistant's turns (``chat_parts``);
* OBELICS' parallel lists, a texts field beside a list of images of the same length, each position holding
  exactly one of a text and an image: ``{"images": [None, "a.jpg"], "texts": ["Look:", None]}``;

* a pair: its images, then its clips, then its text: ``{"image": "a.jpg", "text": "a cat"}`` reads as
  ``(image, "a cat")``. An image or video field holds one value or a list of them.
* an interleaved document: ``{"segments": [{"text": "Look:"}, {"image": "a.jpg"}, "a bare string is text"]}``;
  each segment names exactly one of text, image or video (in Parquet the others are null).

A value of an image or video field is encoded bytes, a ``{"bytes": ..., "path": ...}`` struct (Hugging Face
``datasets``' ``Image()`` and ``Video()``: bytes when set, else the path), or a path relative to the source
root (a path that leaves the root is refused). Empty text is dropped; a document needs at least one
non-empty text and one image or clip, or it is a dead letter.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from connectors.readers.base import Document, MediaFields, MediaRef, Part, location
from connectors.readers.chat_parts import ChatError, chat_content
from topics.formats.dead_letter import DeadLetter
from topics.formats.media import MediaKind

if TYPE_CHECKING:
    from connectors.readers.base import Reader

MediaResolver = Callable[[MediaKind, object, str], MediaRef]
"""``(kind, value, where)`` to the ``MediaRef`` that ``value`` names; ``BadRecord`` when it names none."""


_KINDS: tuple[MediaKind, ...] = ("image", "video")


class BadRecord(ValueError):
    """A record that is no document: the reason is its message."""


def relative_media_path(value: str) -> str:
    """``value`` normalised (``a/./b.jpg`` to ``a/b.jpg``); ``BadRecord`` when it is empty, absolute or leaves
    the source root (``../x``, ``a/../../x``)."""
    normal = posixpath.normpath(value) if value else ""
    if not value or normal == ".":
        raise BadRecord(f"path {value!r} names no file")
    if "://" in value:
        raise BadRecord(f"path {value!r} is a URL; media are read from the source, never fetched")
    if posixpath.isabs(value) or normal == ".." or normal.startswith("../"):
        raise BadRecord(f"path {value!r} leaves the source root")
    return normal


def value_media(kind: MediaKind, value: object, where: str) -> MediaRef:
    """The media a JSON, Parquet or Arrow value gives: bytes, a ``{bytes, path}`` struct, or a path."""
    if isinstance(value, Mapping):
        data, path = value.get("bytes"), value.get("path")
        if data is None and path is None:
            raise BadRecord("has neither bytes nor path")
        if data is not None and not isinstance(data, bytes | bytearray | memoryview):
            raise BadRecord(f"bytes is {type(data).__name__}, not bytes")
        value = data if data is not None else path
    if isinstance(value, bytes | bytearray | memoryview):
        return MediaRef(kind, where, data=bytes(value))
    if isinstance(value, str):
        return MediaRef(kind, where, path=relative_media_path(value))
    raise BadRecord(f"is {type(value).__name__}, not bytes, a path or a {{bytes, path}} struct")


def first_present(record: Mapping[str, object], names: tuple[str, ...]) -> object:
    """The value of the first of ``names`` that ``record`` holds and is not null, else None."""
    for name in names:
        value = record.get(name)
        if value is not None:
            return value
    return None


class _Parts:
    """Parts gathered in order, media named ``<where>:image=<n>`` by their count of each kind."""

    def __init__(self, where: str, resolve: MediaResolver) -> None:
        self.where = where
        self.resolve = resolve
        self.parts: list[Part] = []
        self.counts: dict[str, int] = {"image": 0, "video": 0}

    def text(self, value: object, what: str) -> None:
        if not isinstance(value, str):
            raise BadRecord(f"{what} is {type(value).__name__}, not a string")
        if value:
            self.parts.append(value)

    def media(self, kind: MediaKind, value: object) -> None:
        count = self.counts[kind]
        try:
            ref = self.resolve(kind, value, f"{self.where}:{kind}={count}")
        except BadRecord as exc:
            raise BadRecord(f"{kind} {count}: {exc}") from None
        self.counts[kind] = count + 1
        self.parts.append(ref)

    def checked(self) -> tuple[Part, ...]:
        if not any(isinstance(p, MediaRef) for p in self.parts):
            raise BadRecord("no image or video")
        if not any(isinstance(p, str) for p in self.parts):
            raise BadRecord("no text")
        return tuple(self.parts)


class RecordContent(NamedTuple):
    """A record's parts, and the indices of those that take the loss (None: every part)."""

    parts: tuple[Part, ...]
    trained: frozenset[int] | None = None


def record_content(
    record: Mapping[str, object], fields: MediaFields, where: str, resolve: MediaResolver = value_media
) -> RecordContent:
    """The parts of ``record`` (see the module's docstring); ``BadRecord`` with the reason otherwise.
    ``where`` is the record's location; its media are named ``<where>:image=0``, ``<where>:video=0``..."""
    parts = _Parts(where, resolve)
    turns = first_present(record, fields.conversations)
    if turns is not None:
        _add_media(parts, record, fields)
        media = {kind: [p for p in parts.parts if isinstance(p, MediaRef) and p.kind == kind] for kind in _KINDS}
        try:
            return RecordContent(*chat_content(turns, media))
        except ChatError as exc:
            raise BadRecord(str(exc)) from None
    texts = first_present(record, fields.texts)
    if texts is not None:
        return RecordContent(_parallel_parts(parts, texts, first_present(record, fields.image)))
    return RecordContent(record_parts(record, fields, where, resolve))


def _parallel_parts(parts: _Parts, texts: object, images: object) -> tuple[Part, ...]:
    """OBELICS' ``texts`` and ``images``, position by position."""
    if not isinstance(texts, list) or not isinstance(images, list) or len(texts) != len(images):
        shapes = [
            f"{type(v).__name__} of {len(v)}" if isinstance(v, list) else type(v).__name__ for v in (texts, images)
        ]
        raise BadRecord(f"texts and images must be lists of one length, not a {shapes[0]} and a {shapes[1]}")
    for index, (text, image) in enumerate(zip(texts, images, strict=True)):
        if (text is None) == (image is None):
            held = "both a text and an image" if text is not None else "neither a text nor an image"
            raise BadRecord(f"position {index} of texts and images holds {held}")
        if text is not None:
            parts.text(text, f"text {index}")
        else:
            parts.media("image", image)
    return parts.checked()


def _add_media(parts: _Parts, record: Mapping[str, object], fields: MediaFields) -> None:
    for kind in _KINDS:
        value = first_present(record, getattr(fields, kind))
        for item in value if isinstance(value, list) else [] if value is None else [value]:
            parts.media(kind, item)


def record_parts(
    record: Mapping[str, object], fields: MediaFields, where: str, resolve: MediaResolver = value_media
) -> tuple[Part, ...]:
    """The parts of a pair or an interleaved ``record`` (see the module's docstring); ``BadRecord`` with the
    reason otherwise."""
    parts = _Parts(where, resolve)
    segments = first_present(record, fields.segments)
    if segments is not None:
        if not isinstance(segments, list):
            raise BadRecord(f"segments is {type(segments).__name__}, not a list")
        for index, segment in enumerate(segments):
            _add_segment(parts, fields, index, segment)
        return parts.checked()
    _add_media(parts, record, fields)
    text = first_present(record, fields.text)
    if text is not None:
        parts.text(text, "text")
    return parts.checked()


def _add_segment(parts: _Parts, fields: MediaFields, index: int, segment: object) -> None:
    if isinstance(segment, str):
        parts.text(segment, f"segment {index}")
        return
    if not isinstance(segment, Mapping):
        raise BadRecord(f"segment {index} is {type(segment).__name__}, not an object or a string")
    text = first_present(segment, fields.text)
    media = [(kind, value) for kind in _KINDS if (value := first_present(segment, getattr(fields, kind))) is not None]
    if (text is not None) + len(media) != 1:
        found = ", ".join(["text"] * (text is not None) + [kind for kind, _ in media]) or "none"
        raise BadRecord(f"segment {index} must hold exactly one of text, image and video, not {found}")
    if text is not None:
        parts.text(text, f"segment {index}")
    else:
        parts.media(*media[0])


def media_document(reader: Reader, path: str, row: int, record: object) -> Document | DeadLetter:
    """Row ``row`` of ``path`` as a document of parts, or a dead letter naming the row and the reason."""
    where = location(path, row=row)
    if not isinstance(record, Mapping):
        return reader.dead_letter(where, f"record is {type(record).__name__}, not an object")
    try:
        content = record_content(record, reader.media_fields, where)
    except BadRecord as exc:
        return reader.dead_letter(where, str(exc))
    return Document(reader.source, path, row, parts=content.parts, trained=content.trained)
