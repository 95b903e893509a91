"""Random generators seeded from a job seed and names, the same on every machine and Python process.

Python's ``hash()`` of a string is salted per process, so names are hashed with BLAKE2b instead."""

from __future__ import annotations

import hashlib

import numpy as np


def stable_seed(*parts: str | int) -> list[int]:
    """Four 32-bit words derived from ``parts``; different parts give unrelated words."""
    text = "\x1f".join(f"{type(part).__name__}:{part}" for part in parts)
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def stable_rng(seed: int, source: str, epoch: int) -> np.random.Generator:
    """The generator for one source and epoch of a job with ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(stable_seed(seed, source, epoch)))
