"""Training on context-parallel slices is training on the sample: a tiny causal model whose attention runs over
the slices of a sample held by ``c`` gloo processes (each computes its own tokens' queries, keys and values and
all-gathers the keys and values of the block) gives every token the same loss as the model over the whole
sample, to 1e-6 (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.ports import free_port
from topics.formats.cp_slices import IGNORE_INDEX, slice_of

VOCAB, WIDTH = 97, 24


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = {"embed": (VOCAB, WIDTH), "position": (4096, WIDTH), "q": (WIDTH, WIDTH), "k": (WIDTH, WIDTH)}
    shape |= {"v": (WIDTH, WIDTH), "out": (WIDTH, VOCAB)}
    return {name: torch.randn(size, generator=g, dtype=torch.float64) * 0.3 for name, size in shape.items()}


def _token_losses(
    model: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    labels: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_positions: torch.Tensor,
    length: int,
) -> torch.Tensor:
    """Each query token's loss against its label, attending causally to the keys (by position) of the sample."""
    hidden = model["embed"][tokens] + model["position"][positions]
    query = hidden @ model["q"]
    scores = query @ keys.T / WIDTH**0.5
    allowed = (key_positions[None, :] <= positions[:, None]) & (key_positions[None, :] < length)
    scores = scores.masked_fill(~allowed, float("-inf"))
    mixed = torch.softmax(scores, dim=-1) @ values
    logits = (hidden + mixed) @ model["out"]
    return torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")


def _keys_values(model: dict[str, torch.Tensor], tokens: torch.Tensor, positions: torch.Tensor) -> tuple:
    hidden = model["embed"][tokens] + model["position"][positions]
    return hidden @ model["k"], hidden @ model["v"]


def _whole(tokens: np.ndarray) -> np.ndarray:
    model = _model()
    length = tokens.size
    ids, labels, positions = (torch.from_numpy(a.astype(np.int64)) for a in slice_of(tokens, 1, 0))
    keys, values = _keys_values(model, ids, positions)
    return _token_losses(model, ids, labels, positions, keys, values, positions, length)[labels != IGNORE_INDEX].numpy()


def _rank(rank: int, cp: int, port: int, tokens: np.ndarray, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cp)
    try:
        model = _model()
        ids, labels, positions = (torch.from_numpy(a.astype(np.int64)) for a in slice_of(tokens, cp, rank))
        keys, values = _keys_values(model, ids, positions)
        gathered = {name: [torch.empty_like(t) for _ in range(cp)] for name, t in (("k", keys), ("v", values))}
        dist.all_gather(gathered["k"], keys)
        dist.all_gather(gathered["v"], values)
        every_position = [torch.empty_like(positions) for _ in range(cp)]
        dist.all_gather(every_position, positions)
        losses = _token_losses(
            model,
            ids,
            labels,
            positions,
            torch.cat(gathered["k"]),
            torch.cat(gathered["v"]),
            torch.cat(every_position),
            tokens.size,
        )
        taken = labels != IGNORE_INDEX
        out[rank] = (positions[taken].numpy(), losses[taken].detach().numpy())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("length", "cp"), [(37, 2), (129, 3), (9, 4)])
def test_every_token_s_loss_over_slices_equals_its_loss_over_the_sample(length: int, cp: int) -> None:
    tokens = np.random.default_rng([length, cp]).integers(0, VOCAB, length)
    expected = _whole(tokens)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(cp, free_port(), tokens, out), nprocs=cp, join=True)
        results = dict(out)
    positions = np.concatenate([results[r][0] for r in range(cp)])
    losses = np.concatenate([results[r][1] for r in range(cp)])
    assert sorted(positions.tolist()) == list(range(length - 1)), "every token but the last takes a loss, once"
    np.testing.assert_allclose(losses[np.argsort(positions)], expected, rtol=0, atol=1e-6)
