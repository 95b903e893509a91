"""One definition per JSON record: a frozen dataclass is the record, and its JSON codec is derived from it.

A record class is a dataclass decorated with :func:`json_record`. Its JSON form is an object of its fields
in their order (after the version field, when the record has a version; a topic record may lead with a
``kind``), each under its own name or the one :func:`json_field` gives, the ones marked so left out while
they hold their default. A field's value is written as JSON as it is (dicts, lists and tuples item by
item), a nested record as its own JSON form, and an object with a ``to_json_value()`` method as what that
returns (its class then says how to read it back, with ``__get_pydantic_core_schema__``).

Decoding validates the parsed JSON with a pydantic model made from the dataclass's fields, types (their
``Annotated`` constraints included) and defaults, then builds the dataclass (``__post_init__`` checks too),
and raises ``DecodeError`` naming each wrong field. The model is made at the first decode: the trainer
sink imports ``topics`` and decodes no JSON record, and should not pay for pydantic.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from topics.errors import DecodeError
from topics.formats.validation import describe_errors

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler, TypeAdapter
    from pydantic_core import CoreSchema

R = TypeVar("R")
COMPACT = (",", ":")
"""The separators of the compact records; ``None`` gives ``json.dumps``'s own (``", "`` and ``": "``)."""

_NAME, _OMIT, _ENCODE = "json_record.name", "json_record.omit_default", "json_record.encode"
_REQUIRED = "json_record.required"
_PLAIN = (str, int, float, bool, type(None))


def json_field(
    *,
    name: str | None = None,
    omit_default: bool = False,
    encode: Callable[[Any], Any] | None = None,
    required: bool = False,
    default: Any = MISSING,
    default_factory: Any = MISSING,
) -> Any:
    """A dataclass field written as ``name`` (default: the field's name), left out while it equals its
    default with ``omit_default``, and written as ``encode(value)`` when given. A record must hold a
    ``required`` field even though the dataclass has a default for it."""
    metadata = {_NAME: name, _OMIT: omit_default, _ENCODE: encode, _REQUIRED: required}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


@dataclass(frozen=True)
class RecordFormat:
    """What a record class says about its JSON form: ``what`` names it in errors; ``version`` is written
    first under ``version_key`` and checked before anything else; ``strict`` and ``extra`` are pydantic's."""

    what: str
    version: int | None = None
    version_key: str = "v"
    strict: bool = False
    extra: Literal["ignore", "forbid"] = "ignore"
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Field:
    name: str
    json_name: str
    omit_default: bool
    default: Any
    encode: Callable[[Any], Any] | None


def json_record(
    what: str,
    *,
    version: int | None = None,
    version_key: str = "v",
    strict: bool = False,
    extra: Literal["ignore", "forbid"] = "ignore",
    order: tuple[str, ...] = (),
) -> Callable[[type[R]], type[R]]:
    """Make a dataclass a JSON record (see the module's doc). ``order``: the fields' names in the order
    they are written, when it is not the dataclass's (whose positional arguments stay as they were)."""
    record_format = RecordFormat(what, version, version_key, strict, extra, order)

    def decorate(cls: type[R]) -> type[R]:
        if not dataclasses.is_dataclass(cls):
            msg = f"json_record: {cls.__name__} is not a dataclass"
            raise TypeError(msg)
        if order and sorted(order) != sorted(f.name for f in dataclasses.fields(cls)):
            msg = f"json_record: the order of {cls.__name__} must name each of its fields once, got {order}"
            raise TypeError(msg)
        cls.__json_record__ = record_format  # type: ignore[attr-defined]
        cls.__get_pydantic_core_schema__ = classmethod(_record_schema)  # type: ignore[attr-defined]
        return cls

    return decorate


def record_format(cls: type) -> RecordFormat:
    found = getattr(cls, "__json_record__", None)
    if not isinstance(found, RecordFormat):
        msg = f"{cls.__name__} is not a json_record"
        raise TypeError(msg)
    return found


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """The fields in the order they are written."""
    out = []
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for f in (declared[name] for name in record_format(cls).order or declared):
        default = f.default if f.default_factory is MISSING else f.default_factory()
        name = f.metadata.get(_NAME) or f.name
        out.append(_Field(f.name, name, bool(f.metadata.get(_OMIT)), default, f.metadata.get(_ENCODE)))
    return tuple(out)


# -- encoding --------------------------------------------------------------------------------------------


def to_json_value(value: Any) -> Any:
    """``value`` as what ``json.dumps`` writes: records as their JSON objects, tuples as lists."""
    if type(value) in _PLAIN:
        return value
    if hasattr(type(value), "__json_record__"):
        return record_dict(value)
    if (own := getattr(value, "to_json_value", None)) is not None:
        return own()
    if isinstance(value, Mapping):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    return value


def record_dict(record: Any) -> dict[str, Any]:
    """The JSON object of ``record``, before ``json.dumps``."""
    cls: type = type(record)  # plain ``type``: mypy takes ``type[Any]`` for unhashable in a cached call
    form = record_format(cls)
    body: dict[str, Any] = {} if form.version is None else {form.version_key: form.version}
    for f in _fields(cls):
        value = getattr(record, f.name)
        if f.omit_default and value == f.default:
            continue
        body[f.json_name] = f.encode(value) if f.encode is not None else to_json_value(value)
    return body


def encode(
    record: Any,
    *,
    kind: str | None = None,
    separators: tuple[str, str] | None = COMPACT,
    sort_keys: bool = False,
) -> bytes:
    """``record`` as JSON bytes (ASCII: other characters, lone surrogates too, as ``\\u`` escapes), led by
    ``"kind": kind`` when given."""
    body = record_dict(record)
    if kind is not None:
        body = {"kind": kind, **body}
    return json.dumps(body, separators=separators, sort_keys=sort_keys, allow_nan=False).encode()


# -- decoding --------------------------------------------------------------------------------------------


def decode(cls: type[R], data: bytes | str | None) -> R:
    """The ``cls`` record that ``data`` holds; ``DecodeError`` saying "not a <what> record", the version
    found, or which fields are wrong. Lone surrogates in strings are taken, as ``json`` takes them."""
    form = record_format(cls)
    try:
        body = json.loads(data)  # type: ignore[arg-type]
    except (ValueError, TypeError, RecursionError) as exc:  # TypeError: a value that is not bytes (None)
        msg = f"not a {form.what} record: not JSON: {exc}"
        raise DecodeError(msg) from exc
    return validate(cls, body)


def validate(cls: type[R], body: object) -> R:
    """The ``cls`` record that the parsed JSON ``body`` holds; ``DecodeError`` as :func:`decode`."""
    from pydantic import ValidationError

    form = record_format(cls)
    if form.version is not None:
        found = body.get(form.version_key) if isinstance(body, dict) else None
        if type(found) is not int or found != form.version:
            msg = f"{form.what} version {found!r:.40}, expected {form.version}"
            raise DecodeError(msg)
    try:
        plain: type = cls  # as in record_dict
        return _adapter(plain).validate_python(body)
    except ValidationError as exc:
        msg = f"{form.what} is not valid: {describe_errors(exc, cls)}"
        raise DecodeError(msg) from exc


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


@functools.cache
def _document_model(cls: type) -> type:
    """The JSON form of ``cls`` as a pydantic model: its fields under their JSON names, with their types
    and defaults. A version field is checked by :func:`validate`, and ignored here."""
    from pydantic import ConfigDict, Field, create_model

    form = record_format(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = f.metadata.get(_NAME) or f.name
        if f.metadata.get(_REQUIRED):
            info = Field(alias=name)
        elif f.default is not MISSING:
            info = Field(f.default, alias=name)
        elif f.default_factory is not MISSING:
            info = Field(default_factory=f.default_factory, alias=name)
        else:
            info = Field(alias=name)
        definitions[f.name] = (hints[f.name], info)
    # With extra "forbid" the record must have no version field, which is not one of the model's fields.
    config = ConfigDict(strict=form.strict, extra=form.extra, frozen=True)
    return create_model(f"{cls.__name__}Json", __config__=config, **definitions)


def _record_schema(cls: type, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    """A record class's pydantic schema: its JSON model, then the dataclass built from the model's fields."""
    from pydantic_core import core_schema

    names = [f.name for f in dataclasses.fields(cls)]

    def build(document: Any) -> Any:
        return cls(**{name: getattr(document, name) for name in names})

    return core_schema.no_info_after_validator_function(build, handler(_document_model(cls)))


def shaped_schema(handler: GetCoreSchemaHandler, json_type: Any, build: Callable[[Any], Any]) -> CoreSchema:
    """For a class whose JSON form is ``json_type`` (e.g. ``tuple[str, int]``): validate that, then ``build``
    the object from it. Use in the class's ``__get_pydantic_core_schema__``."""
    from pydantic_core import core_schema

    return core_schema.no_info_after_validator_function(build, handler.generate_schema(json_type))
