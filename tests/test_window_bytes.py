"""Composition windows bounded by bytes (``composition.window_bytes``): the window a source's draw chooses from
ends where its share of the bytes runs out (never short of one step of its tokens), the draw is a pure function
of the FIFO however much more is buffered, and every sample is still drawn within the waiting bound; over
families of lengths and of sample sizes uncorrelated with them (media) and proportional to them (text)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.mixing import DrawStatus, Mixer, Schedule, draw_step
from pipeline.planning.mixing.compose import HEADROOM, waiting_bound, window_need
from pipeline.planning.mixing.mixer import Composition
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import StepCore, StepWindow
from pipeline.spec import load_spec
from tests.loader_support import REPO
from tests.multimodal_example_support import multimodal_data_builder, multimodal_spec
from topics.errors import MixflowError

SHAPE = StepShape(2, 2, 1024)
EXAMPLE = REPO / "examples" / "example.yaml"
COST = CostModel(alpha=1.0, beta=1.0 / 1024)


def test_the_window_is_its_steps_until_the_share_of_bytes_is_known_to_run_out() -> None:
    lengths = np.array([100, 100, 100, 100])
    sizes = np.array([10, 10, 10, 10])
    assert window_need(lengths, sizes, unit=150, window=2, byte_share=None) == 300
    assert window_need(lengths, sizes, unit=150, window=2, byte_share=40) == 300, "share not passed: its end unknown"
    assert window_need(lengths, sizes, unit=100, window=4, byte_share=25) == 200, "two samples fit the share"
    assert window_need(lengths, sizes, unit=150, window=4, byte_share=5) == 150, "never short of one step"
    assert window_need(lengths, sizes, unit=50, window=2, byte_share=35) == 100, "never past the window's steps"


def test_the_spec_takes_window_bytes_and_refuses_less_than_a_mebibyte(tmp_path: Path) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["composition"] = {"window_bytes": 1 << 30}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(body))
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.composition is not None and spec.composition.window_bytes == 1 << 30
    composition = Mixer.from_spec(spec).composition
    assert composition is not None and composition.window_bytes == 1 << 30
    body["composition"] = {"window_bytes": 1000}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(MixflowError, match="window_bytes"):
        load_spec(tmp_path / "spec.yaml")


def _stream(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    capacity = SHAPE.tokens_per_micro_batch
    if kind == "long/short":
        lengths = np.where(rng.random(n) < 0.9, rng.integers(20, 200, n), rng.integers(capacity // 4, capacity, n))
    elif kind == "lognormal":
        lengths = np.clip(rng.lognormal(np.log(capacity / 30), 1.0, n), 1, capacity).astype(np.int64)
    else:
        lengths = rng.integers(1, capacity // 2, n)
    if kind == "lognormal":
        sizes = 4 * lengths  # text: the tokens are the bytes
    else:
        sizes = 4 * lengths + np.where(rng.random(n) < 0.5, rng.integers(20_000, 400_000, n), 0)  # media
    return lengths.astype(np.int64), sizes.astype(np.int64)


def _window_end(lengths: np.ndarray, sizes: np.ndarray, unit: float, window: float, share: float) -> tuple[int, int]:
    """The samples in the window, and how many it takes to see that: up to the first past the share of bytes."""
    need = window_need(lengths, sizes, unit, window, share)
    within = int(np.searchsorted(np.cumsum(sizes), share, side="right"))
    return int(np.searchsorted(np.cumsum(lengths), need, side="left")) + 1, within


@settings(deadline=None, max_examples=15)
@given(
    st.sampled_from(["long/short", "lognormal", "uniform"]),
    st.sampled_from([0.3, 1.0, 2.0]),
    st.integers(0, 2**16),
)
def test_draws_choose_within_the_bytes_are_pure_and_keep_the_waiting_bound(
    kind: str, steps_of_bytes: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    window, due = 3.0, 0.5
    weights = {"a": 0.6, "b": 0.4}
    names = list(weights)
    goal = math.floor(SHAPE.tokens_per_step * (1 - HEADROOM))
    parts = [_stream(kind, 3000, rng) for _ in names]
    lengths = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([p[1] for p in parts])
    source = np.concatenate([np.full(len(p[0]), k) for k, p in enumerate(parts)])
    bytes_per_token = {s: float(parts[k][1].sum() / parts[k][0].sum()) for k, s in enumerate(names)}
    # A budget of ``steps_of_bytes`` steps of the sources' bytes: below the window's four steps, or at one.
    window_bytes = steps_of_bytes * goal * sum(w * bytes_per_token[s] for s, w in weights.items())
    composition = Composition(SHAPE, COST, window, due, window_bytes)
    mixer = Mixer(Schedule(names, [0], [list(weights.values())]), SHAPE.tokens_per_step, composition=composition)
    core = StepCore(SHAPE, COST)
    fifo = {s: np.flatnonzero(source == k) for k, s in enumerate(names)}
    entered, drawn = np.full(len(lengths), -1), np.full(len(lengths), -1)
    deferred = np.zeros(0, dtype=np.int64)
    state = mixer.initial_state()
    steps = 14
    shortened = 0

    def window_of(held: dict[str, np.ndarray]) -> StepWindow:
        by_source = {s: lengths[ids] for s, ids in held.items()}
        return StepWindow(
            by_source, source[deferred], lengths[deferred], sizes={s: sizes[ids] for s, ids in held.items()}
        )

    for step in range(steps):
        ends, seen = {}, {}
        for s, w in weights.items():
            ends[s], seen[s] = _window_end(lengths[fifo[s]], sizes[fifo[s]], w * goal, window, w * window_bytes)
            inside = fifo[s][: ends[s]]
            entered[inside[entered[inside] < 0]] = step
            shortened += ends[s] < _window_end(lengths[fifo[s]], sizes[fifo[s]], w * goal, window, math.inf)[0]
        held = window_of(fifo)
        draw = core.draw(mixer, state, held)
        assert draw.status is DrawStatus.OK
        # The in-order draw's head is always in the window (one step of a source's tokens and its credit).
        head = draw_step(state, mixer.weights_at(step), goal, held.available, held.deferred_by_source())
        ends = {s: max(ends[s], len(head.take[s])) for s in names}
        # Cut to the samples that show where each window ends: the same draw.
        cut = {s: fifo[s][: max(ends[s], seen[s]) + 1] for s in names}
        again = core.draw(mixer, state, window_of(cut))
        for s in names:
            np.testing.assert_array_equal(draw.take[s], again.take[s], err_msg=f"{s}: the draw saw past its window")
            assert not len(draw.take[s]) or draw.take[s][-1] < ends[s], f"{s}: a sample past its window was chosen"
        planned = core.plan(draw, held).planned
        assert planned is not None
        candidates = planned.candidates_of(deferred, fifo)
        for s in names:
            drawn[fifo[s][planned.taken[s]]] = step
            fifo[s] = np.delete(fifo[s], planned.taken[s])
        deferred = candidates[~planned.plan.placed_mask]
        state = planned.next_state
    longest = SHAPE.tokens_per_micro_batch / (min(weights.values()) * goal)
    bound = waiting_bound(window, due, longest, longest)
    early = (entered >= 0) & (entered + bound < steps)
    assert early.any() and np.all(drawn[early] >= 0), f"a sample in its window waited past the bound of {bound} steps"
    assert shortened > 0, "the bytes never ended a window before its steps: nothing was tested"


@pytest.mark.kafka
def test_a_multimodal_job_with_its_look_ahead_bounded_by_bytes_delivers_each_sample_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """The multimodal example, its look-ahead held to the least ``window_bytes`` allows (1 MiB, about a step
    of this job's images): the constructor's feed pauses sources by bytes and the windows end by bytes, and
    the run's report finds every sample once."""
    data = tmp_path / "data"
    multimodal_data_builder().build(data, pairs=40, documents=8, clips=6, limit=12)
    spec = multimodal_spec(tmp_path, data, unique_name, kafka_bootstrap, window_bytes=1 << 20)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name]
    run = subprocess.run(
        [*command, "--state-dir", str(tmp_path / "state")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "each sample exactly once: yes" in run.stdout, run.stdout
    assert "every committed source sample reached a rank topic: yes" in run.stdout, run.stdout
