"""Sample-length families for the constructor's batch tests: each a numpy draw of ``count`` lengths in
``[1, capacity]``."""

from __future__ import annotations

import numpy as np

FAMILIES = ["uniform", "lognormal", "bimodal", "one-long"]


def draw_lengths(family: str, rng: np.random.Generator, count: int, capacity: int) -> np.ndarray:
    draw = {
        "uniform": lambda: rng.integers(1, capacity + 1, count),
        "lognormal": lambda: np.clip(rng.lognormal(np.log(capacity / 8), 1.0, count), 1, capacity),
        "bimodal": lambda: np.where(rng.random(count) < 0.1, capacity, rng.integers(1, 64, count)),
        "one-long": lambda: np.concatenate([[capacity], np.ones(max(count - 1, 0))])[:count],
    }[family]
    return draw().astype(np.int64)
