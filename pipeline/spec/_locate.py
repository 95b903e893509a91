"""Turning a pydantic error location into a field path, a YAML line, and a list of known keys."""

from __future__ import annotations

import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel

Loc = tuple[str | int, ...]


def field_path(loc: Loc) -> str:
    """``("sources", 1, "tokenizer")`` -> ``sources[1].tokenizer``; keys that are not plain names
    are quoted: ``kafka.config["bootstrap.servers"]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "a").replace("-", "a").isalnum():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def line_of(root: yaml.Node | None, loc: Loc) -> int | None:
    """The 1-based line of the deepest node on ``loc`` in the composed YAML document."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        node = _child(node, part)
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _child(node: yaml.Node, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                # The key's own line: for an unknown or bad key, that is where to look.
                return value if not isinstance(value, yaml.ScalarNode) else key
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part]
    return None


def duplicate_keys(node: yaml.Node | None, loc: Loc = ()) -> list[tuple[Loc, int]]:
    """Mapping keys given twice (YAML would silently keep the last): ``(location, line)``."""
    found: list[tuple[Loc, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if name in seen:
                found.append(((*loc, name), key.start_mark.line + 1))
            seen.add(name)
            found += duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, (*loc, i))
    return found


def known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The field names allowed beside the last part of ``loc`` (for "did you mean")."""
    tp: Any = model
    for part in loc[:-1]:
        tp = _step(tp, part)
        if tp is None:
            return []
    tp = _model_in(tp)
    return list(tp.model_fields) if tp is not None else []


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(tp):
            if (found := _model_in(arg)) is not None:
                return found
    return None


def _step(tp: Any, part: str | int) -> Any:
    if (model := _model_in(tp)) is not None and isinstance(part, str):
        field = model.model_fields.get(part)
        return field.annotation if field else None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(tp):
            if arg is not type(None) and (found := _step(arg, part)) is not None:
                return found
    if origin is list and isinstance(part, int):
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    return None
