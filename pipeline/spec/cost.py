"""The per-sample cost model: a sample of length ``L`` costs ``alpha*L^2 + beta*L + gamma``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                msg = f"{name} must be a finite number >= 0, got {value!r}"
                raise ValueError(msg)

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
        for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                msg = f"{name} must be an integer >= 1, got {value!r}"
                raise ValueError(msg)
        h, n = float(hidden_size), float(num_layers)
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


# A 7B-class model: hidden size 4096, 32 layers, causal attention.
DEFAULT_COST_MODEL = CostModel.from_transformer(4096, 32)
