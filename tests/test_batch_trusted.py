"""The trusted path of ``Batch.from_arrays``: the constructor's batches skip the checks they meet by
construction, and every other batch (decoded from Kafka, built elsewhere) is still checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.planning.scheduler import CostModel, plan_step
from pipeline.planning.step.assemble import build_batches
from tests.length_families import FAMILIES, draw_lengths
from topics.formats.batch import CHECK_TRUSTED_ENV, Batch
from topics.formats.batch_codec import decode_batch, encode_batch
from topics.formats.sample import Sample

FIELDS = ("step", "rank", "ranks", "micro_batches", "capacity")


@pytest.mark.parametrize("distribution", FAMILIES)
@pytest.mark.parametrize("seed", range(4))
def test_constructor_batches_pass_every_check(distribution: str, seed: int, monkeypatch) -> None:
    """What ``build_batches`` makes unchecked passes ``Batch``'s full check and is what the checked path makes."""
    monkeypatch.delenv(CHECK_TRUSTED_ENV, raising=False)
    rng = np.random.default_rng(seed)
    ranks, micro_batches, capacity = int(rng.integers(1, 64)), int(rng.integers(1, 5)), int(rng.integers(64, 4096))
    count = int(rng.integers(0, ranks * micro_batches * 6 + 2))
    lengths = draw_lengths(distribution, rng, count, capacity)
    samples = [
        Sample(f"s/{i}", ["web", "code", "m"][int(rng.integers(0, 3))], rng.integers(0, 50_000, int(n), dtype=np.int32))
        for i, n in enumerate(lengths)
    ]
    plan = plan_step(lengths, ranks, micro_batches, capacity, CostModel(1.0, 50.0))
    trusted = build_batches(3, plan, samples, lengths)
    monkeypatch.setenv(CHECK_TRUSTED_ENV, "1")
    checked = build_batches(3, plan, samples, lengths)
    for got, expected in zip(trusted, checked, strict=True):
        again = Batch(*(getattr(got, name) for name in FIELDS), records=got.records)  # raises if a check fails
        assert again == got == expected
        assert encode_batch(got) == encode_batch(expected)


@given(
    lengths=st.lists(st.integers(2, 50), min_size=1, max_size=12),
    micro_batches=st.integers(1, 3),
    spare=st.integers(0, 10_000),
)
def test_only_trusted_batches_skip_the_checks(lengths: list[int], micro_batches: int, spare: int) -> None:
    """A batch over its capacity: refused when built untrusted, when its env switch asks for checks, and
    when decoded from its Kafka message; made only on the trusted path."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    capacity = 1 + spare % (sum(lengths) - 1)  # below the tokens of micro-batch 0
    arrays = dict(
        step=1,
        rank=0,
        ranks=1,
        micro_batches=micro_batches,
        capacity=capacity,
        sample_ids=[f"s/{i}" for i in range(len(lengths))],
        sources=["web"] * len(lengths),
        micro_batch=np.zeros(len(lengths), np.int32),  # all in micro-batch 0: over capacity
        offsets=offsets,
        tokens=np.zeros(int(offsets[-1]), np.int32),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CHECK_TRUSTED_ENV, raising=False)
        bad = Batch.from_arrays(**arrays, trusted=True)
        with pytest.raises(ValueError, match="over capacity"):
            Batch.from_arrays(**arrays)
        patch.setenv(CHECK_TRUSTED_ENV, "1")
        with pytest.raises(ValueError, match="over capacity"):
            Batch.from_arrays(**arrays, trusted=True)
    _, value, headers = encode_batch(bad)
    with pytest.raises(Exception, match="over capacity"):
        decode_batch(value, headers)
