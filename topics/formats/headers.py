"""Kafka header helpers shared by the codecs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

HeaderValue = bytes | str | None
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue] | None
"""What confluent_kafka's ``Message.headers()`` returns (a list of pairs, or ``None``), or a dict."""

_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")


def find_header(headers: Headers, key: str) -> bytes | None:
    """The value of header ``key`` as bytes, or ``None`` when absent.

    Raises ``ValueError`` when the header appears more than once with different values."""
    if headers is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found: list[bytes] = []
    for name, value in pairs:
        if name == key:
            found.append(value.encode() if isinstance(value, str) else (value or b""))
    if len(set(found)) > 1:
        msg = f"header {key!r} appears {len(found)} times with different values"
        raise ValueError(msg)
    return found[0] if found else None


def decimal(value: int) -> bytes:
    """The canonical decimal ASCII form of a non-negative int: ``42`` -> ``b"42"``."""
    return str(value).encode("ascii")


def parse_decimal(what: str, value: bytes | None) -> int:
    """Parse a canonical decimal ASCII non-negative int (no sign, spaces or leading zeros).

    Raises ``ValueError`` naming ``what`` otherwise."""
    if value is None:
        msg = f"{what} is missing"
        raise ValueError(msg)
    if not _DECIMAL.fullmatch(value):
        msg = f"{what} is not a canonical decimal number: {value[:40]!r}"
        raise ValueError(msg)
    return int(value)
