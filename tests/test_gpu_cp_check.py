"""benchmarks/gpu_cp_check.py run on the CPU with a tiny block and step, so that the command a GPU lease runs once
has run here first: plans, the rank slices' layout, the timing, the step times and the JSON it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from benchmarks import _cp_block, gpu_cp_check  # noqa: E402
from benchmarks.cp_bench import POOLS, megatron_step_time, pool_of  # noqa: E402
from topics.formats.cp_slices import zigzag_positions  # noqa: E402

RANKS, MICRO, CAPACITY, LONGEST = 16, 2, 256, 4096
POOL_NAMES = ("lognormal", "turns+books")  # the ByteScale-like pool needs samples past 128k
MEGATRON = importlib.util.find_spec("megatron") is not None


@st.composite
def slot_samples(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    samples = []
    for _ in range(draw(st.integers(1, 4))):
        cp = draw(st.sampled_from([1, 2, 3, 4, 8]))
        samples.append((draw(st.integers(1, 300)), cp, draw(st.integers(0, cp - 1))))
    return samples


@settings(max_examples=60, deadline=None)
@given(slot_samples())
def test_a_slot_attends_to_the_query_key_pairs_of_its_zigzag_slices(samples: list[tuple[int, int, int]]) -> None:
    layout = _cp_block.layout_of(samples, torch.device("cpu"))
    length, cp, place = (np.array([s[i] for s in samples]) for i in range(3))
    positions, counts = zigzag_positions(length, cp, place)
    assert layout.tokens == int(counts.sum())
    # every query of a slice attends to every key of its sample up to its own position, once
    causal = np.diff(layout.causal.cu_q.numpy()).astype(np.int64)
    pairs = int((causal * (causal + 1) // 2).sum())
    if layout.full is not None:
        pairs += int((np.diff(layout.full.cu_q.numpy()) * np.diff(layout.full.cu_k.numpy())).sum())
        assert layout.full_keys.numel() == int(np.diff(layout.full.cu_k.numpy()).sum())
        assert int(layout.full_keys.max()) < layout.received
    assert pairs == int((positions + 1).sum())
    assert torch.equal(layout.causal.cu_q, layout.causal.cu_k)
    split = cp > 1
    assert layout.received == int((counts * cp)[split].sum())
    assert layout.own_positions.unique().numel() == layout.own_rows.numel() == int(counts[split].sum())


def test_the_check_times_every_plan_and_its_steps_follow_the_plan(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--device", "cpu", "--ranks", str(RANKS), "--micro-batches", str(MICRO)]
    argv += ["--sizes", f"{CAPACITY}:{LONGEST}", "--block", "64,4,2", "--repeats", "1", "--pools", ",".join(POOL_NAMES)]
    assert gpu_cp_check.main(argv) == 0
    result = json.loads((tmp_path / "gpu_cp_check.json").read_text())
    assert result["communication"] == "not timed" and result["attention"] == "sdpa" and result["skipped"] == []
    assert [cell["pool"] for cell in result["cells"]] == list(POOL_NAMES)
    sizes: set[int] = set()
    for cell in result["cells"]:
        pool = next(p for p in POOLS if p.name == cell["pool"])
        lengths = pool_of(pool, np.random.default_rng([0, RANKS, CAPACITY, LONGEST]), RANKS * MICRO * CAPACITY, LONGEST)
        assert cell["samples"] == lengths.size
        plans = gpu_cp_check.plans_of(lengths, RANKS, MICRO, CAPACITY)
        assert set(cell["plans"]) == {"aligned", "static", *(["megatron"] if MEGATRON else [])}
        if MEGATRON:
            row = cell["plans"]["megatron"]
            times = np.asarray(row["micro_times_s"])
            assert times.shape[0] == RANKS and (times.max(axis=0) > 0).all() and (times >= 0).all()
            assert row["measured_s"] == pytest.approx(times.max(axis=0).sum())  # its groups end at a barrier
            cost = gpu_cp_check.one_layer_cost(64, 4, 2)
            assert row["predicted_s"] == pytest.approx(megatron_step_time(lengths, RANKS, CAPACITY, cost)[0])
            assert cell["megatron_over_static_measured"] > 0
        for name, plan in plans.items():
            row = cell["plans"][name]
            times = np.asarray(row["micro_times_s"])
            assert times.shape == (RANKS, plan.shape.max_micro_batches)
            used = np.zeros(times.shape, bool)
            for rank, micro in gpu_cp_check.rank_micro_batches(plan, lengths):
                used[rank, micro] = True
            assert (times[used] > 0).all() and (times[~used] == 0).all()
            micro, first, size, _ = plan.block_micro_batches()
            for m, f, c in zip(micro, first, size, strict=True):  # a block's ranks hold the same samples
                assert np.unique(times[f : f + c, m]).size == 1
            assert row["measured_s"] == pytest.approx(plan.step_time_of(times))
            assert times.sum(axis=1).max() <= row["measured_s"] * (1 + 1e-9)
            assert row["measured_s"] <= times.max(axis=0).sum() * (1 + 1e-9)  # no worse than a barrier a micro-batch
            assert row["predicted_s"] == pytest.approx(plan.step_time(lengths, gpu_cp_check.one_layer_cost(64, 4, 2)))
            assert row["predicted_s"] >= row["predicted_compute_s"] > 0
            assert row["measured_over_predicted"] == pytest.approx(row["measured_s"] / row["predicted_s"])
            assert row["tokens"] == int(lengths[plan.placed_mask].sum())
        sizes.update(int(c) for c in plans["aligned"].cp[plans["aligned"].placed_mask])
        assert cell["aligned_over_static_measured"] == pytest.approx(
            cell["plans"]["aligned"]["measured_tokens_per_s"] / cell["plans"]["static"]["measured_tokens_per_s"]
        )
    assert {1, 16} <= sizes  # samples whole and split over every rank: both attention paths timed
