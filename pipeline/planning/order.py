"""The order in which a step's candidates go to the scheduler, which defers the last ones first. Pure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def candidate_order(deferred: int, drawn: Sequence[np.ndarray]) -> np.ndarray:
    """The step's candidates in priority order, as indices into ``[0 .. deferred-1, *drawn]``: the
    ``deferred`` samples first (they keep their order), then the samples ``drawn`` from each source (their
    lengths, one array per source) interleaved by the share of their source's drawn tokens before them, so
    that no source is always last when the scheduler has to defer. Ties go to the earlier source, then to
    the earlier sample of a source, as sorting ``(share before, source, place)`` tuples would."""
    shares, source_of = [], []
    for k, lengths in enumerate(drawn):
        as_float = np.asarray(lengths, dtype=np.float64)
        total = as_float.sum() or 1.0
        shares.append((np.cumsum(as_float) - as_float) / total)
        source_of.append(np.full(len(as_float), k))
    if not shares:
        return np.arange(deferred)
    # A stable sort keeps each source's samples in their order among equal keys.
    interleaved = np.lexsort((np.concatenate(source_of), np.concatenate(shares)))
    return np.concatenate([np.arange(deferred), deferred + interleaved])
