"""The per-sample cost models: a sample of length ``L`` costs ``alpha*L^2 + beta*L + gamma`` in the LLM
(``CostModel``), and each of its images or clips of ``n`` patches ``alpha*n^2 + beta*n + gamma`` in the
vision encoder (``VisionCostModel``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def _check_coefficients(model: object) -> None:
    for name in ("alpha", "beta", "gamma"):
        value = getattr(model, name)
        if not np.isfinite(value) or value < 0:
            msg = f"{name} must be a finite number >= 0, got {value!r}"
            raise ValueError(msg)


def _check_shape(hidden_size: int, num_layers: int) -> tuple[float, float]:
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            msg = f"{name} must be an integer >= 1, got {value!r}"
            raise ValueError(msg)
    return float(hidden_size), float(num_layers)


@dataclass(frozen=True)
class CostModel:
    """Cost of one sample of ``L`` tokens: ``alpha*L**2 + beta*L + gamma`` (any unit, e.g. FLOPs or ms).

    ``alpha`` is attention (every pair of tokens), ``beta`` the linear layers (every token), ``gamma``
    whatever a sample costs whatever its length (0 in the FLOP model; ``mixflow calibrate`` measures it).
    Only ratios between samples matter to the scheduler, so the unit is free; ``costs`` is what
    ``plan_step``'s kernels balance.
    """

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        _check_coefficients(self)

    @classmethod
    def from_transformer(cls, hidden_size: int, num_layers: int, causal: bool = True) -> CostModel:
        """Forward FLOPs of a decoder-only transformer with hidden size ``h`` and ``n`` layers.

        Per token, the linear layers (QKV and output projections ``4h^2`` weights, an MLP of width
        ``4h`` with ``8h^2`` weights; two FLOPs per multiply-add) cost ``24*h^2*n``: that is ``beta``.
        Per sample, the attention scores ``QK^T`` and their product with ``V`` cost ``2*L^2*h`` each,
        ``4*h*L^2*n`` in all, halved under a causal mask: that is ``alpha*L^2`` with
        ``alpha = 4*h*n`` (``2*h*n`` when causal). The backward pass multiplies both by about the
        same factor, which does not change the balance.
        """
        h, n = _check_shape(hidden_size, num_layers)
        alpha = 4.0 * h * n * (0.5 if causal else 1.0)
        return cls(alpha=alpha, beta=24.0 * h * h * n)

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """float64 cost of each sample, element by element (no reduction, so bit-identical anywhere)."""
        as_float = np.asarray(lengths).astype(np.float64)
        costs = (self.alpha * as_float) * as_float + self.beta * as_float
        return costs + self.gamma if self.gamma else costs

    def total(self, lengths: np.ndarray) -> float:
        """The cost of all ``lengths`` together, from exact integer sums of ``L`` and ``L**2``: the same
        float on any machine, and far cheaper than an exactly rounded sum of ``costs``."""
        as_int = np.asarray(lengths).astype(np.int64).reshape(-1)
        if not as_int.size:
            return 0.0
        longest = int(np.abs(as_int).max())
        if longest * longest * as_int.size < 2**63:
            squares = int(np.dot(as_int, as_int))
        else:  # int64 could overflow: Python ints are exact at any size
            squares = sum(x * x for x in as_int.tolist())
        return self.alpha * float(squares) + self.beta * float(int(as_int.sum())) + self.gamma * float(as_int.size)


@dataclass(frozen=True)
class VisionCostModel:
    """Cost in the vision encoder of one image or clip of ``n`` patches: ``alpha*n**2 + beta*n + gamma``.

    The encoder attends within each item (Qwen2-VL's ViT: full attention over an image's patches, or a
    clip's), so the quadratic term is per item and a sample's encoder cost is the sum over its items
    (``sample_costs``). In the same unit as the LLM's ``CostModel`` (FLOPs from both models' shapes, or
    both measured), since the scheduler adds the two.
    """

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        _check_coefficients(self)

    @classmethod
    def from_vit(cls, hidden_size: int, num_layers: int) -> VisionCostModel:
        """Forward FLOPs of a ViT with hidden size ``h`` and ``n`` layers, non-causal: per patch ``24*h^2*n``
        (``beta``), per pair of patches of one item ``4*h*n`` (``alpha``); see ``CostModel.from_transformer``.
        The patch embedding and the merger after the last layer are left out (linear, and small)."""
        h, n = _check_shape(hidden_size, num_layers)
        return cls(alpha=4.0 * h * n, beta=24.0 * h * h * n)

    def costs(self, patches: np.ndarray) -> np.ndarray:
        """float64 cost of each item of ``patches`` patches, element by element."""
        as_float = np.asarray(patches).astype(np.float64)
        costs = (self.alpha * as_float) * as_float + self.beta * as_float
        return costs + self.gamma if self.gamma else costs

    def sample_cost(self, item_patches: Iterable[int]) -> float:
        """The encoder cost of one sample of items of ``item_patches`` patches: ``sample_costs`` of that sample
        alone, the same float, without arrays (the constructor prices every sample it reads)."""
        total = 0.0
        for patches in item_patches:
            x = float(patches)
            cost = (self.alpha * x) * x + self.beta * x
            total += cost + self.gamma if self.gamma else cost
        return total

    def sample_costs(self, item_patches: np.ndarray, items_per_sample: np.ndarray) -> np.ndarray:
        """float64 encoder cost of each sample: ``item_patches`` holds the patches of every item, sample
        after sample, ``items_per_sample`` how many items each sample has (0 for text: cost 0). Sums in
        item order, so the same floats on any machine."""
        counts = np.asarray(items_per_sample, dtype=np.int64).reshape(-1)
        item_costs = self.costs(np.asarray(item_patches).reshape(-1))
        if item_costs.size != int(counts.sum()):
            msg = f"{item_costs.size} items for samples holding {int(counts.sum())}"
            raise ValueError(msg)
        owner = np.repeat(np.arange(counts.size), counts)
        return np.bincount(owner, weights=item_costs, minlength=counts.size).astype(np.float64, copy=False)


# A 7B-class model: hidden size 4096, 32 layers, causal attention.
DEFAULT_COST_MODEL = CostModel.from_transformer(4096, 32)
