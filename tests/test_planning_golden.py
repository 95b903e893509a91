"""What the constructor's pure core decides, pinned: for seeded streams of sample lengths, each step's
composition (``compose_step``), plan (``plan_step`` from the composition's placement), deferred samples
and mixer state, and the bytes of encoded batches, digested per case and compared with
``tests/golden/planning.json``. A refactor that claims no behaviour change must leave every digest as it
is; a change of behaviour updates the file deliberately, in its own commit, with

    python -m tests.test_planning_golden --update

(`benchmarks/refactor_check.py --base REV` compares whole jobs on Kafka, loaders included.)"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.planning.mixing import DrawStatus, MixerState
from pipeline.planning.mixing.compose import compose_step
from pipeline.planning.scheduler import DEFAULT_COST_MODEL, plan_step
from pipeline.planning.shape import StepShape
from tests.sink_support import random_batch
from topics.formats.batch_codec import encode_batch

GOLDEN = Path(__file__).resolve().parent / "golden" / "planning.json"
STEPS = 8

Family = Callable[[np.random.Generator, int, int], np.ndarray]


def _web(rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    return rng.lognormal(np.log(capacity / 130), 0.8, n)


def _code(rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    return rng.lognormal(np.log(capacity / 40), 1.2, n)


def _long(rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    return rng.uniform(capacity / 4, capacity, n)


@dataclass(frozen=True)
class Case:
    name: str
    seed: int
    ranks: int
    micro_batches: int
    capacity: int
    weights: dict[str, float]


FAMILIES: dict[str, Family] = {"web": _web, "code": _code, "long": _long}
CASES = (
    Case("small", 1, 2, 2, 1024, {"web": 0.5, "code": 0.3, "long": 0.2}),
    Case("wide", 2, 16, 2, 1024, {"web": 0.7, "code": 0.25, "long": 0.05}),
    Case("long-heavy", 3, 4, 8, 8192, {"web": 0.2, "code": 0.2, "long": 0.6}),
    Case("two-sources", 4, 8, 2, 2048, {"web": 0.6, "code": 0.4}),
)


def case_digest(case: Case) -> str:
    """sha256 over every step's lengths, placement, plan, deferred samples and state, then encoded batches."""
    rng = np.random.default_rng(case.seed)
    sources = list(case.weights)
    fifo = {s: np.clip(FAMILIES[s](rng, 200_000, case.capacity), 1, case.capacity).astype(np.int64) for s in sources}
    deferred = {s: np.zeros(0, np.int64) for s in sources}
    state = MixerState.initial(sources)
    budget = case.ranks * case.micro_batches * case.capacity
    digest = hashlib.sha256()
    for _ in range(STEPS):
        draw = compose_step(
            state,
            case.weights,
            budget,
            fifo,
            deferred,
            shape=StepShape(case.ranks, case.micro_batches, case.capacity),
            cost_model=DEFAULT_COST_MODEL,
        )
        assert draw.status is DrawStatus.OK, f"{case.name}: step {state.step} {draw.status}"
        order = [s for s in sources for _ in range(len(draw.lengths[s]))]
        lengths = np.concatenate([draw.lengths[s] for s in sources]).astype(np.int64)
        start = draw.start_for(order)
        plan = plan_step(lengths, case.ranks, case.micro_batches, case.capacity, DEFAULT_COST_MODEL, start=start)
        placed = plan.placed_mask
        codes = np.asarray([sources.index(s) for s in order], np.int64)
        deferred = {s: lengths[(codes == k) & ~placed] for k, s in enumerate(sources)}
        for s in sources:
            fifo[s] = np.delete(fifo[s], draw.take[s])
        state = draw.settle(deferred)
        for part in (lengths, start if start is not None else np.zeros(0), plan.rank, plan.micro, placed):
            digest.update(np.ascontiguousarray(part).tobytes())
        digest.update(state.to_bytes())
    for step in range(3):  # the rank topics' record format
        for rank in range(2):
            key, value, headers = encode_batch(random_batch(rng, step, rank, 2, 3, case.capacity))
            digest.update(key + value + repr(headers).encode())
    return digest.hexdigest()


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_planning_core_decides_as_pinned(case: Case) -> None:
    pinned = json.loads(GOLDEN.read_text())
    assert case.name in pinned, f"no digest pinned for {case.name}: run python -m tests.test_planning_golden --update"
    assert case_digest(case) == pinned[case.name], (
        f"{case.name}: the composition, plan, state or batch bytes changed. If the change of behaviour is meant, "
        "pin it with python -m tests.test_planning_golden --update in a commit that says so."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="print, or with --update rewrite, the pinned planning digests")
    parser.add_argument("--update", action="store_true", help=f"write them to {GOLDEN}")
    args = parser.parse_args()
    digests = {case.name: case_digest(case) for case in CASES}
    text = json.dumps(digests, indent=2) + "\n"
    if args.update:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
