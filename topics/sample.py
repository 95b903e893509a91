"""A tokenized sample: the unit that source loaders publish and the constructor mixes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Sample:
    """One tokenized sample.

    ``sample_id`` is stable and unique within a job: ``<source>/<path relative to the source root>/<row>``,
    plus ``#<chunk>`` when a long document was split, plus ``@e<n>`` for epochs after the first.
    ``tokens`` is a one-dimensional ``int32`` array.
    """

    sample_id: str
    source: str
    tokens: np.ndarray
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])
