"""A conversation record (LLaVA's ``conversations``, ShareGPT's or the chat APIs' ``messages``) as a document's
parts, with the parts that take the loss.

A turn is ``{"from": ..., "value": ...}`` (LLaVA, ShareGPT) or ``{"role": ..., "content": ...}``; its role is
``human`` or ``user``, ``gpt`` or ``assistant``, or ``system``. Each turn is rendered as one line::

    SYSTEM: <text>\\n
    USER: <text>\\n
    ASSISTANT: <text>\\n

and the loss applies to the assistant's text and its closing newline only, never to a role prefix, a user's or
system's turn or a medium, as LLaVA trains. A ``content`` may also be a list of ``{"type": "text", "text": ...}``
and ``{"type": "image"}`` (or ``"video"``) items, as chat templates take it.

The record's images and clips (its image and video fields, ``MediaFields``) stand where the text places them:
at each ``<image>`` (``<video>``) in a turn, or each ``{"type": "image"}`` item, in order. A record with media
and no placeholder at all has them at the start of its first turn, as LLaVA puts ``<image>\\n`` there; any other
count of placeholders that differs from the count of media is a dead letter, as is a conversation without
an assistant turn with text. A conversation needs no medium: LLaVA's mixtures hold text-only ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from connectors.readers.base import MediaRef, Part
from topics.formats.media import MediaKind

PLACEHOLDERS: dict[MediaKind, str] = {"image": "<image>", "video": "<video>"}
ROLES: dict[str, str] = {
    "human": "USER",
    "user": "USER",
    "gpt": "ASSISTANT",
    "assistant": "ASSISTANT",
    "system": "SYSTEM",
}
ASSISTANT = "ASSISTANT"


class ChatError(ValueError):
    """A conversation that is no document: the reason is its message."""


class ChatContent(NamedTuple):
    """The rendered parts, and the indices of the text parts that take the loss."""

    parts: tuple[Part, ...]
    trained: frozenset[int]


class _Pieces:
    """A turn's content as text and placeholders: ``("text", str)`` or ``("image", "")``."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def text(self, value: str) -> None:
        for k, piece in enumerate(_split(value)):
            if k % 2:
                self.items.append((piece, ""))
            elif piece:
                self.items.append(("text", piece))


def _split(value: str) -> list[str]:
    """``value`` cut at its placeholders: text, kind, text, kind, ..., text."""
    out = [value]
    for kind, mark in PLACEHOLDERS.items():
        cut: list[str] = []
        for k, piece in enumerate(out):
            if k % 2:
                cut.append(piece)
                continue
            texts = piece.split(mark)
            for j, text in enumerate(texts):
                if j:
                    cut.append(kind)
                cut.append(text)
        out = cut
    return out


def turn_pieces(turn: object, index: int) -> tuple[str, _Pieces]:
    """The rendered role (``USER``...) and the content of turn ``index``; ``ChatError`` for a malformed turn."""
    if not isinstance(turn, Mapping):
        raise ChatError(f"turn {index} is {type(turn).__name__}, not an object")
    role = turn.get("from", turn.get("role"))
    content = turn.get("value", turn.get("content"))
    if not isinstance(role, str) or role.lower() not in ROLES:
        raise ChatError(f"turn {index} has role {role!r}, not one of {', '.join(ROLES)}")
    pieces = _Pieces()
    if isinstance(content, str):
        pieces.text(content)
    elif isinstance(content, list):
        for j, item in enumerate(content):
            kind = item.get("type") if isinstance(item, Mapping) else None
            if kind == "text" and isinstance(item.get("text"), str):  # type: ignore[union-attr]
                pieces.text(item["text"])  # type: ignore[index]
            elif kind in PLACEHOLDERS:
                pieces.items.append((kind, ""))  # type: ignore[arg-type]
            else:
                raise ChatError(f"turn {index} item {j} is not a text, image or video item")
    elif content is not None:
        raise ChatError(f"turn {index} content is {type(content).__name__}, not a string or a list")
    return ROLES[role.lower()], pieces


def chat_content(turns: object, media: Mapping[MediaKind, list[MediaRef]]) -> ChatContent:
    """The conversation ``turns`` rendered with ``media`` (each kind's references in order) at its
    placeholders; see the module's docstring."""
    if not isinstance(turns, list):
        raise ChatError(f"conversation is {type(turns).__name__}, not a list of turns")
    rendered = [turn_pieces(turn, k) for k, turn in enumerate(turns)]
    _place_unmarked_media(rendered, media)
    parts: list[Part] = []
    trained: set[int] = set()
    queues = {kind: list(refs) for kind, refs in media.items()}

    def text(value: str, learn: bool) -> None:
        if not value:
            return
        last = len(parts) - 1
        if parts and isinstance(parts[-1], str) and (last in trained) == learn:
            parts[-1] += value  # type: ignore[operator]
            return
        parts.append(value)
        if learn:
            trained.add(len(parts) - 1)

    for role, pieces in rendered:
        learn = role == ASSISTANT
        text(f"{role}: ", False)
        for kind, value in pieces.items:
            if kind == "text":
                text(value, learn)
            else:
                parts.append(queues[kind].pop(0))  # type: ignore[index]
        text("\n", learn)
    if not any(parts[k].strip("\n") for k in trained):  # type: ignore[union-attr]
        raise ChatError("conversation has no assistant turn with text")
    return ChatContent(tuple(parts), frozenset(trained))


def _place_unmarked_media(rendered: list[tuple[str, _Pieces]], media: Mapping[MediaKind, list[MediaRef]]) -> None:
    """Check each kind's placeholders against its media; with none at all, put them at the first turn's start."""
    for kind, refs in media.items():
        marks = sum(1 for _, pieces in rendered for item, _ in pieces.items if item == kind)
        if marks == len(refs):
            continue
        if marks or not rendered:
            mark = PLACEHOLDERS[kind]
            raise ChatError(f"conversation has {marks} {mark} placeholders for {len(refs)} {kind}s")
        first = rendered[0][1].items
        first[:0] = [item for _ in refs for item in ((kind, ""), ("text", "\n"))]
