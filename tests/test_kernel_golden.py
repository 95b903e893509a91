"""Plans of the scheduler and of step composition, and what the composition kernels build, compared with
recorded digests (``tests/golden/kernels.json``): identical inputs must give identical outputs, to the byte.
A change that means to alter plans records them again and says so.

The inputs are seeded families (tie-heavy lengths among them: ties are where a search's tie rule shows),
step shapes from 1 to 70 ranks, placements to start from, and runs of composed steps as the constructor
makes them (deferred samples first in the next draw).

    .venv/bin/python -m tests.test_kernel_golden --record       # only with the code the digests are from
    .venv/bin/python -m tests.test_kernel_golden --record-new   # cases not recorded yet, the others kept
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.planning.mixing import DrawStatus, MixerState
from pipeline.planning.mixing._composition.groups import build_groups
from pipeline.planning.mixing._composition.packing import pack_bins_kernel
from pipeline.planning.mixing._composition.values import HoleFill, Longs, StepMedia
from pipeline.planning.mixing.compose import HEADROOM, compose_step
from pipeline.planning.scheduler import CostModel, plan_lpt, plan_step, plan_with_media
from pipeline.planning.shape import StepShape

GOLDEN = Path(__file__).resolve().parent / "golden" / "kernels.json"

Case = Callable[[], str]


def _digest(*arrays: object) -> str:
    """sha256 over each array's dtype, shape and bytes (None as a marker of its own)."""
    h = hashlib.sha256()
    for array in arrays:
        if array is None:
            h.update(b"none;")
            continue
        a = np.ascontiguousarray(array)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _lengths(family: str, rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    draw = {
        "uniform": lambda: rng.integers(1, capacity + 1, n),
        "lognormal": lambda: np.clip(rng.lognormal(np.log(capacity / 8), 1.0, n), 1, capacity),
        "pareto": lambda: np.clip(capacity / 100 * (1 + rng.pareto(1.1, n)), 1, capacity),
        "bimodal": lambda: np.where(rng.random(n) < 0.1, capacity, rng.integers(1, 64, n)),
        "few-values": lambda: rng.choice([capacity // 8 or 1, capacity // 4 or 1, capacity // 2 or 1, capacity], n),
        "ones": lambda: np.ones(n),
        "uniform-long": lambda: rng.integers(capacity // 4, capacity + 1, n),
    }[family]
    return np.clip(np.rint(draw()), 1, capacity).astype(np.int64)


PLAN_FAMILIES = ("uniform", "lognormal", "pareto", "bimodal", "few-values", "ones", "uniform-long")
COST_MODELS = (CostModel(alpha=1e-3, beta=1.0), CostModel(alpha=0.0, beta=1.0), CostModel(alpha=1.0, beta=0.0))


def _start(rng: np.random.Generator, lengths: np.ndarray, slots: int, capacity: int) -> np.ndarray:
    """A valid placement of some of ``lengths``: each, in random order, to a random micro-batch it fits."""
    start = np.full(len(lengths), -1, np.int64)
    held = np.zeros(slots, np.int64)
    for i in rng.permutation(len(lengths)):
        slot = int(rng.integers(0, slots))
        if rng.random() < 0.8 and held[slot] + lengths[i] <= capacity:
            start[i] = slot
            held[slot] += lengths[i]
    return start


def _plan_case(seed: int) -> str:
    rng = np.random.default_rng([1, seed])
    ranks = int(rng.choice([1, 2, 3, 5, 8, 13, 16, 64, 70]))
    micro = int(rng.choice([1, 2, 3, 4, 8]))
    capacity = int(rng.choice([16, 64, 1000, 4096]))
    family = PLAN_FAMILIES[seed % len(PLAN_FAMILIES)]
    fill = float(rng.choice([0.2, 0.7, 1.0, 1.3, 3.0]))
    mean = {"ones": 1.0, "few-values": capacity / 3, "bimodal": capacity / 8, "uniform-long": 0.6 * capacity}.get(
        family, capacity / 4
    )
    n = max(1, int(fill * ranks * micro * capacity / max(mean, 1.0)))
    lengths = _lengths(family, rng, min(n, 6000), capacity)
    cost_model = COST_MODELS[int(rng.integers(0, len(COST_MODELS)))]
    tolerance = float(rng.choice([0.0, 0.001, 0.05]))
    start = _start(rng, lengths, ranks * micro, capacity) if rng.random() < 0.4 else None
    plan = plan_step(lengths, ranks, micro, capacity, cost_model, tolerance=tolerance, start=start)
    lpt = plan_lpt(lengths, ranks, micro, capacity, cost_model)
    safe = plan_lpt(lengths, ranks, micro, capacity, cost_model, starvation_safe=True)
    return _digest(plan.rank, plan.micro, lpt.rank, lpt.micro, safe.rank, safe.micro)


def _samples(rng: np.random.Generator, n: int, low: int, capacity: int, sources: int) -> Longs:
    length = rng.integers(low, capacity + 1, n)
    return Longs(length * (length / capacity) - 0.1 * length, length, rng.integers(0, sources, n))


def _groups_case(seed: int) -> str:
    rng = np.random.default_rng([2, seed])
    shape = StepShape(int(rng.integers(1, 12)), int(rng.integers(1, 5)), int(rng.integers(50, 500)))
    capacity, sources = shape.tokens_per_micro_batch, int(rng.integers(1, 4))
    seeds = _samples(rng, int(rng.integers(0, shape.ranks + 2)), capacity // 8, capacity, sources)
    longs = _samples(rng, int(rng.integers(0, 80)), capacity // 4, capacity, sources)
    shorts = _samples(rng, int(rng.integers(0, 80)), 1, capacity, sources)
    candidates = Longs(*(np.concatenate([a, b]) for a, b in zip(_fields(longs), _fields(shorts), strict=True)))
    order = np.lexsort((rng.random(len(longs.length)), -longs.excess))
    allowance = rng.uniform(-capacity, 3 * shape.tokens_per_step / sources, sources)
    level = float(rng.uniform(0, 2 * capacity))
    slack = float(rng.choice([0.0, rng.uniform(0, 10)]))
    first = rng.integers(1, capacity // 4 + 1, int(rng.integers(0, 4)))
    by_length = np.lexsort((rng.random(len(candidates.length)), candidates.length))
    goal = float(rng.uniform(0.5, 1.0) * shape.tokens_per_step)
    filler = np.zeros(sources) if rng.random() < 0.8 else np.full(sources, np.inf)
    holes = HoleFill(by_length, filler, first, goal, (1.0 / capacity, -0.1, 0.0)) if rng.random() < 0.7 else None
    anchor = int(rng.integers(-1, len(longs.length))) if len(longs.length) else -1
    groups = build_groups(seeds, candidates, order, allowance, level, slack, shape, anchor, holes)
    return _digest(groups.chosen, groups.excess, groups.bins, groups.slots.seed, groups.slots.cand, groups.slots.first)


def _fields(samples: Longs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return samples.excess, samples.length, samples.source


def _bins_case(seed: int) -> str:
    rng = np.random.default_rng([3, seed])
    ranks, micro, capacity = int(rng.integers(1, 12)), int(rng.integers(1, 5)), int(rng.integers(50, 500))
    tokens = ranks * micro * capacity
    sources = int(rng.integers(1, 4))
    seeds = rng.integers(capacity // 8, capacity + 1, int(rng.integers(0, ranks + 2)))
    first = rng.integers(1, capacity // 4 + 1, int(rng.integers(0, 4)))
    length = rng.integers(1, capacity + 1, int(rng.integers(0, 150)))
    source = rng.integers(0, sources, len(length))
    by_length = np.lexsort((rng.random(len(length)), length))
    allowance = rng.uniform(-capacity, 2 * tokens / sources, sources)
    goal = float(rng.uniform(0.5, 1.0) * tokens)
    cost = np.array([1.0 / capacity, 1.0, float(rng.choice([0.0, 3.0]))])
    out = pack_bins_kernel(seeds, first, length, source, by_length, allowance, goal, ranks, micro, capacity, cost)
    return _digest(*out)


COMPOSE_RUNS = (
    (("lognormal", "bimodal"), (0.7, 0.3), (8, 2, 1000)),
    (("uniform",), (1.0,), (4, 2, 1000)),
    (("uniform-long", "lognormal"), (0.5, 0.5), (3, 4, 256)),
    (("pareto",), (1.0,), (8, 1, 4096)),
    (("few-values", "uniform"), (0.6, 0.4), (5, 2, 512)),
    (("bimodal", "uniform-long", "lognormal"), (0.5, 0.2, 0.3), (16, 2, 1000)),
    (("uniform",), (1.0,), (1, 4, 1000)),
    (("uniform-long",), (1.0,), (13, 1, 2048)),
)


def _compose_run(index: int, seed: int, steps: int = 6) -> str:
    """Composed steps as the constructor makes them; the digest of every draw's take, placement and plan."""
    families, shares, (ranks, micro, capacity) = COMPOSE_RUNS[index]
    rng = np.random.default_rng([4, index, seed])
    names = [f"s{k}" for k in range(len(families))]
    weights = dict(zip(names, shares, strict=True))
    cost_model = CostModel(alpha=3.0 / capacity, beta=1.0)
    tokens = ranks * micro * capacity
    fifo = {}
    for s, family, share in zip(names, families, shares, strict=True):
        chunks = [_lengths(family, rng, 256, capacity)]
        while sum(int(c.sum()) for c in chunks) < share * (steps + 12) * tokens + 4 * capacity:
            chunks.append(_lengths(family, rng, 256, capacity))
        fifo[s] = np.concatenate(chunks)
    deferred = {s: np.zeros(0, np.int64) for s in names}
    state = MixerState.initial(names)
    goal = math.floor(tokens * (1 - HEADROOM))
    digests = []
    for _ in range(steps):
        available = {}
        for s, share in zip(names, shares, strict=True):
            ahead = np.cumsum(fifo[s]) - fifo[s]
            available[s] = fifo[s][ahead < 10 * share * goal + 2 * capacity]
        draw = compose_step(
            state, weights, tokens, available, deferred, shape=StepShape(ranks, micro, capacity),
            cost_model=cost_model,
        )  # fmt: skip
        assert draw.status is DrawStatus.OK
        sources = [s for s in names for _ in range(len(draw.lengths[s]))]
        lengths = np.concatenate([draw.lengths[s] for s in names])
        plan = plan_step(lengths, ranks, micro, capacity, cost_model, start=draw.start_for(sources))
        placement = None if draw.placement is None else np.concatenate([draw.placement[s] for s in names])
        digests.append(_digest(*(draw.take[s] for s in names), lengths, placement, plan.rank, plan.micro))
        codes = np.array([names.index(s) for s in sources], np.int64)
        deferred = {s: lengths[(codes == k) & ~plan.placed_mask] for k, s in enumerate(names)}
        for s in names:
            fifo[s] = np.delete(fifo[s], draw.take[s])
        state = draw.settle(deferred)
    return _digest(np.frombuffer("".join(digests).encode(), np.uint8))


def _patches(rng: np.random.Generator, n: int, budget: int) -> np.ndarray:
    """Vision patches of ``n`` samples: text (none), images of a few sizes, and clips, often tied."""
    kind = rng.choice(3, n, p=[0.5, 0.4, 0.1])
    images = rng.choice([64, 256, 256, 1024, max(1, budget // 3)], n)
    clips = rng.integers(max(1, budget // 4), max(2, budget), n)
    return np.where(kind == 0, 0, np.where(kind == 1, images, clips)).astype(np.int64)


def _media_start(
    rng: np.random.Generator, lengths: np.ndarray, patches: np.ndarray, slots: int, shape: tuple
) -> np.ndarray:
    """A placement of some samples within both capacities of ``shape`` (tokens, patches or 0 for none)."""
    capacity, patch_capacity = shape
    start = np.full(len(lengths), -1, np.int64)
    tokens, held = np.zeros(slots, np.int64), np.zeros(slots, np.int64)
    for i in rng.permutation(len(lengths)):
        slot = int(rng.integers(0, slots))
        fits = tokens[slot] + lengths[i] <= capacity and (
            patch_capacity == 0 or held[slot] + patches[i] <= patch_capacity
        )
        if rng.random() < 0.8 and fits:
            start[i] = slot
            tokens[slot] += lengths[i]
            held[slot] += patches[i]
    return start


def _media_plan_case(seed: int) -> str:
    """Multimodal steps: costs that do not follow length, patches under a budget (or none), the encoder's
    part evened out or not, and placements to start from."""
    rng = np.random.default_rng([5, seed])
    ranks = int(rng.choice([1, 2, 3, 5, 8, 16, 33]))
    micro = int(rng.choice([1, 2, 4]))
    capacity = int(rng.choice([64, 1000, 4096]))
    budget = int(rng.choice([0, 256, 1024, 4096]))
    family = PLAN_FAMILIES[seed % len(PLAN_FAMILIES)]
    fill = float(rng.choice([0.3, 1.0, 1.4, 3.0]))
    n = max(1, int(fill * ranks * micro * capacity / max(capacity / 4, 1.0)))
    lengths = _lengths(family, rng, min(n, 3000), capacity)
    patches = _patches(rng, len(lengths), budget or 2048)
    if budget:
        patches = np.minimum(patches, budget)
    cost_model = COST_MODELS[int(rng.integers(0, len(COST_MODELS)))]
    encoder = patches * float(rng.choice([0.5, 3.0])) * (1 + (rng.random(len(lengths)) < 0.2))
    costs = cost_model.costs(lengths) + encoder
    tolerance = float(rng.choice([0.0, 0.001, 0.05]))
    even = bool(rng.random() < 0.6)
    start = _media_start(rng, lengths, patches, ranks * micro, (capacity, budget)) if rng.random() < 0.4 else None
    common = {"costs": costs, "patches": patches, "patch_capacity": budget}
    plan = plan_step(
        lengths, ranks, micro, capacity, cost_model, tolerance=tolerance, start=start,
        encoder_costs=encoder if even else None, **common,
    )  # fmt: skip
    lpt = plan_lpt(lengths, ranks, micro, capacity, cost_model, **common)
    safe = plan_lpt(lengths, ranks, micro, capacity, cost_model, starvation_safe=True, **common)
    return _digest(plan.rank, plan.micro, lpt.rank, lpt.micro, safe.rank, safe.micro)


def _media_compose_run(index: int, seed: int, steps: int = 5) -> str:
    """Composed multimodal steps as the constructor makes them (``StepMedia``, ``plan_with_media``)."""
    families, shares, (ranks, micro, capacity) = COMPOSE_RUNS[index]
    rng = np.random.default_rng([6, index, seed])
    budget = int(rng.choice([0, capacity // 2, 2 * capacity]))
    names = [f"s{k}" for k in range(len(families))]
    weights = dict(zip(names, shares, strict=True))
    cost_model = CostModel(alpha=3.0 / capacity, beta=1.0)
    tokens = ranks * micro * capacity
    fifo, fifo_patches = {}, {}
    for s, family, share in zip(names, families, shares, strict=True):
        chunks = [_lengths(family, rng, 256, capacity)]
        while sum(int(c.sum()) for c in chunks) < share * (steps + 12) * tokens + 4 * capacity:
            chunks.append(_lengths(family, rng, 256, capacity))
        fifo[s] = np.concatenate(chunks)
        fifo_patches[s] = _patches(rng, len(fifo[s]), budget or capacity)
        if budget:
            fifo_patches[s] = np.minimum(fifo_patches[s], budget)
    deferred = {s: np.zeros(0, np.int64) for s in names}
    deferred_patches = {s: np.zeros(0, np.int64) for s in names}
    state = MixerState.initial(names)
    goal = math.floor(tokens * (1 - HEADROOM))
    shape = StepShape(ranks, micro, capacity, budget)
    digests = []
    for _ in range(steps):
        available, patches = {}, {}
        for s, share in zip(names, shares, strict=True):
            ahead = np.cumsum(fifo[s]) - fifo[s]
            keep = ahead < 10 * share * goal + 2 * capacity
            available[s], patches[s] = fifo[s][keep], fifo_patches[s][keep]
        media = StepMedia(
            patches, {s: 2.0 * p for s, p in patches.items()}, deferred_patches,
            {s: 2.0 * p for s, p in deferred_patches.items()},
        )  # fmt: skip
        draw = compose_step(
            state, weights, tokens, available, deferred, shape=shape, cost_model=cost_model, media=media
        )  # fmt: skip
        assert draw.status is DrawStatus.OK
        sources = [s for s in names for _ in range(len(draw.lengths[s]))]
        lengths = np.concatenate([draw.lengths[s] for s in names])
        step_patches, encoder = media.of_step(names, draw.take)
        plan = plan_with_media(lengths, shape, cost_model, draw.start_for(sources), step_patches, encoder)
        placement = None if draw.placement is None else np.concatenate([draw.placement[s] for s in names])
        digests.append(_digest(*(draw.take[s] for s in names), lengths, placement, plan.rank, plan.micro))
        codes = np.array([names.index(s) for s in sources], np.int64)
        waiting = (codes[:, None] == np.arange(len(names))) & ~plan.placed_mask[:, None]
        deferred = {s: lengths[waiting[:, k]] for k, s in enumerate(names)}
        deferred_patches = {s: step_patches[waiting[:, k]] for k, s in enumerate(names)}
        for s in names:
            fifo[s] = np.delete(fifo[s], draw.take[s])
            fifo_patches[s] = np.delete(fifo_patches[s], draw.take[s])
        state = draw.settle(deferred)
    return _digest(np.frombuffer("".join(digests).encode(), np.uint8))


def cases() -> Iterator[tuple[str, Case]]:
    for seed in range(240):
        yield f"plan-{seed}", lambda seed=seed: _plan_case(seed)
    for seed in range(150):
        yield f"groups-{seed}", lambda seed=seed: _groups_case(seed)
    for seed in range(150):
        yield f"bins-{seed}", lambda seed=seed: _bins_case(seed)
    for index in range(len(COMPOSE_RUNS)):
        for seed in range(2):
            yield f"compose-{index}-{seed}", lambda index=index, seed=seed: _compose_run(index, seed)
    for seed in range(200):
        yield f"mediaplan-{seed}", lambda seed=seed: _media_plan_case(seed)
    for index in range(len(COMPOSE_RUNS)):
        yield f"mediacompose-{index}-0", lambda index=index: _media_compose_run(index, 0)


def _kind(name: str) -> str:
    return name.split("-")[0]


@pytest.mark.parametrize("kind", ["plan", "groups", "bins", "compose", "mediaplan", "mediacompose"])
def test_outputs_are_those_recorded(kind: str) -> None:
    recorded = json.loads(GOLDEN.read_text())
    differ = [name for name, case in cases() if _kind(name) == kind and case() != recorded[name]]
    assert not differ, f"{len(differ)} case(s) differ from the recorded outputs, first ones: {differ[:8]}"


if __name__ == "__main__" and sys.argv[1:] in (["--record"], ["--record-new"]):
    GOLDEN.parent.mkdir(exist_ok=True)
    kept = json.loads(GOLDEN.read_text()) if sys.argv[1] == "--record-new" and GOLDEN.exists() else {}
    recorded = {name: kept[name] if name in kept else case() for name, case in cases()}
    GOLDEN.write_text(json.dumps(recorded, indent=0, sort_keys=True) + "\n")
    print(f"recorded {GOLDEN}")
