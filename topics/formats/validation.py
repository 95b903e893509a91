"""A pydantic ``ValidationError`` as one line that names each wrong field, for the JSON record decoders
(work units, work plans, the constructor and mixer state, dead letters), which raise it as a
``DecodeError``.

This module does not import pydantic: ``topics`` is imported by the trainer sink, which decodes no JSON
records and should not pay for pydantic. The decoders import it when they first decode."""

from __future__ import annotations

import functools
import re
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_CLAUSES = 5
"""At most this many problems are spelled out; the rest are counted."""

_UNKNOWN = frozenset({"extra_forbidden", "unexpected_keyword_argument"})
_MISSING = frozenset({"missing", "missing_argument", "missing_keyword_only_argument"})
_EXPECTED = {
    "int_type": "int",
    "int_parsing": "int",
    "int_from_float": "int",
    "string_type": "a string",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "dataclass_type": "a JSON object",
    "typed_dict_type": "a JSON object",
    "list_type": "a JSON array",
    "tuple_type": "a JSON array",
}
_BOUNDS = {
    "greater_than_equal": ">= {ge}",
    "greater_than": "> {gt}",
    "less_than_equal": "<= {le}",
    "less_than": "< {lt}",
}
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def describe_errors(exc: ValidationError, record: type | None = None) -> str:
    """``exc`` as ``field 'start' must be int, got '0'; unknown fields ['colour']; ...``.

    ``record`` is the validated type; its fields that may be ``None`` are said to be "... or null"."""
    nullable = _nullable_fields(record) if record is not None else frozenset()
    unknown: list[str] = []
    missing: list[str] = []
    clauses: list[str] = []
    for error in exc.errors(include_url=False):
        kind, loc = error["type"], tuple(error["loc"])
        if kind in _UNKNOWN:
            unknown.append(_path(loc))
        elif kind in _MISSING and not (loc and isinstance(loc[-1], int)):
            missing.append(_path(loc))
        else:
            clauses.append(_clause(error, loc, nullable))
    clauses = [
        *([f"unknown fields {sorted(unknown)}"] if unknown else []),
        *([f"missing fields {missing}"] if missing else []),
        *clauses,
    ]
    if len(clauses) > MAX_CLAUSES:
        clauses = [*clauses[:MAX_CLAUSES], f"and {len(clauses) - MAX_CLAUSES} more problems"]
    return "; ".join(clauses)


def _clause(error: Any, loc: tuple[Any, ...], nullable: frozenset[str]) -> str:
    kind, context, value = error["type"], error.get("ctx") or {}, error.get("input")
    got = f", got {value!r:.60}"
    if loc[-1:] == ("[key]",):  # a dict key, e.g. ('ends', 'x', '[key]')
        what = f"field {_path(loc[:-2])!r} key {loc[-2]!r}"
    else:
        what = f"field {_path(loc)!r}" if loc else "the record"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        if len(loc) == 1 and loc[0] in nullable:
            expected += " or null"
        return f"{what} must be {expected}{got}"
    if kind == "literal_error":
        expected = context.get("expected", "")
        return f"{what} is {value!r:.60}, not {'one of ' if ' or ' in expected else ''}{expected}"
    if kind in _BOUNDS:
        return f"{what} must be {_BOUNDS[kind].format(**context)}{got}"
    if kind in _MISSING:  # an item of a fixed-length array, e.g. ('sources', 'a', 1)
        return f"field {_path(loc[:-1])!r} has no item {loc[-1]}"
    if kind == "too_long" and "max_length" in context:
        return f"{what} must have at most {context['max_length']} items{got}"
    if kind in ("value_error", "assertion_error") and "error" in context:
        message = str(context["error"])
        return f"{what}: {message}" if loc else message
    return f"{what}: {error['msg']}{got}"


def _path(loc: tuple[Any, ...]) -> str:
    """``('sources', 'code', 1)`` as ``sources.code[1]``; keys that are not plain names in brackets."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _NAME.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


@functools.cache
def _nullable_fields(record: type) -> frozenset[str]:
    hints = typing.get_type_hints(record)
    return frozenset(name for name, hint in hints.items() if type(None) in typing.get_args(hint))
