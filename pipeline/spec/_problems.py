"""Located validation problems raised from inside model validators.

Pydantic merges a ``ValidationError`` raised by a validator into the outer one and prefixes each
error's location with the validator's own, so a check on the whole job can still name the exact
field (``sources[1].max_sample_length``) and every problem it finds is reported, not just the first.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

Loc = tuple[str | int, ...]


class _NoValue:
    def __repr__(self) -> str:
        return "<no value>"


NO_VALUE: Any = _NoValue()
"""The ``value`` of a problem that is about something missing rather than a bad value."""


class Problems:
    """Collects ``(location, message, value)`` and raises them together as one ``ValidationError``."""

    def __init__(self, title: str) -> None:
        self._title = title
        self._details: list[InitErrorDetails] = []

    def add(self, loc: Loc, message: str, value: Any = NO_VALUE) -> None:
        # The message goes through as a template argument, so braces in it are not template fields.
        error = PydanticCustomError("mixflow_spec", "{message}", {"message": message})
        self._details.append(InitErrorDetails(type=error, loc=loc, input=value))

    def __bool__(self) -> bool:
        return bool(self._details)

    def raise_if_any(self) -> None:
        if self._details:
            raise ValidationError.from_exception_data(self._title, self._details)
