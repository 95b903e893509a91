"""Causal attention over packed samples with torch's ``varlen_attn``, whichever way the installed torch
spells "causal" (``is_causal=True`` in some releases, ``window_size=(-1, 0)`` in others)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.cache
def causal_varlen_attn() -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """``varlen_attn`` and the keyword arguments that make it causal on this torch; ``None`` when this
    torch has no ``varlen_attn`` or it takes neither argument."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    if "is_causal" in parameters:
        return varlen_attn, {"is_causal": True}
    if "window_size" in parameters:
        return varlen_attn, {"window_size": (-1, 0)}  # (left, right): everything before, nothing after
    return None
