"""Families of multimodal samples for the scheduler's and the step core's tests: each sample has tokens and,
for its images and clips, vision patches (a clip's ``t * h * w``, an image's ``h * w``, sides a multiple of
the merge size 2, one placeholder token per 4 patches), at any scale of micro-batch capacities."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.spec.cost import CostModel, VisionCostModel

FAMILIES = ("text", "image-heavy", "mixed", "huge-images", "video")


@dataclass(frozen=True)
class Multimodal:
    """Samples in priority order: ``lengths`` and ``patches`` (int64) of each, and the patches of every
    item, sample after sample, with ``items`` per sample."""

    lengths: np.ndarray
    patches: np.ndarray
    item_patches: np.ndarray
    items: np.ndarray

    def costs(self, llm: CostModel, vision: VisionCostModel) -> np.ndarray:
        """LLM cost plus encoder cost of each sample."""
        return llm.costs(self.lengths) + vision.sample_costs(self.item_patches, self.items)


def _item(rng: np.random.Generator, patch_room: int, video: bool, huge: bool) -> int:
    """Patches of one image or clip of at most ``patch_room`` patches (0 where not even 2 x 2 fit)."""
    t = int(rng.integers(1, 5)) if video else 1
    side = 2 * (math.isqrt(patch_room // t) // 2)
    if side < 2:
        return 0
    if huge:
        return t * side * side
    h, w = (2 * rng.integers(1, side // 2 + 1, 2)).tolist()
    return t * h * w


def _media(family: str, rng: np.random.Generator) -> tuple[int, bool, bool]:
    """How many items a sample of ``family`` has, whether they are clips, whether huge."""
    roll = rng.random()
    if family == "text":
        return 0, False, False
    if family == "image-heavy":
        return (int(rng.integers(1, 4)) if roll < 0.9 else 0), False, False
    if family == "mixed":
        return (int(rng.integers(1, 3)) if roll < 0.5 else 0), roll < 0.1, False
    if family == "huge-images":
        return (1 if roll < 0.05 else 0), False, True
    return (1 if roll < 0.6 else 0), True, False


def draw_multimodal(
    family: str, rng: np.random.Generator, count: int, capacity: int, patch_capacity: int
) -> Multimodal:
    """``count`` samples of ``family``: none longer than ``capacity`` tokens or with more than
    ``patch_capacity`` patches."""
    lengths, patches, item_patches, items = [], [], [], []
    for _ in range(count):
        n_items, video, huge = _media(family, rng)
        text = int(np.clip(rng.lognormal(math.log(max(capacity / 16, 1)), 1.0), 1, capacity))
        mine: list[int] = []
        for _ in range(n_items):
            left = min(patch_capacity - sum(mine), 4 * (capacity - text - sum(mine) // 4))
            item = _item(rng, max(left, 0), video, huge)
            if item:
                mine.append(item)
        lengths.append(min(capacity, text + sum(mine) // 4))
        patches.append(sum(mine))
        item_patches += mine
        items.append(len(mine))
    as_int = [np.array(v, np.int64) for v in (lengths, patches, item_patches, items)]
    return Multimodal(*as_int)
