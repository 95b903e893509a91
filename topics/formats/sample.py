"""A tokenized sample: the unit that source loaders publish and the constructor mixes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topics.formats.media import MediaItem


@dataclass(frozen=True, slots=True)
class Sample:
    """One tokenized sample.

    ``sample_id`` is stable and unique within a job: ``<source>/<path relative to the source root>/<row>``,
    plus ``#<chunk>`` when a long document was split, plus ``@e<n>`` for epochs after the first.
    ``tokens`` is a one-dimensional ``int32`` array. ``media``: the images and clips whose placeholder
    tokens ``tokens`` holds, in the order they appear (empty for text).
    """

    sample_id: str
    source: str
    tokens: np.ndarray
    metadata: dict[str, str] = field(default_factory=dict)
    media: tuple[MediaItem, ...] = ()

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def patches(self) -> int:
        """Vision-encoder patches over all its media (0 for text)."""
        return sum(item.patches for item in self.media)
