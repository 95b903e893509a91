"""What ``mixflow calibrate`` prints: the fit's quality per micro-batch, and the spec's ``cost:`` section."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pipeline.tools.calibrate.fit import CostFit


@dataclass(frozen=True)
class Provenance:
    """Where and on what the times were measured, for the comment above the section."""

    device: str
    torch: str
    dtype: str
    attention: str
    hidden: int
    heads: int
    layers: int
    day: date


def yaml_float(value: float) -> str:
    """``value`` to 4 significant digits, spelled so that YAML 1.1 reads a float (``1.0e-07``, not ``1e-07``)."""
    mantissa, e, exponent = f"{value:.4g}".partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def cost_section(fit: CostFit, where: Provenance) -> str:
    """The ``cost:`` section for the spec, with a comment saying what was measured on what."""
    ratio = f"beta/alpha = {fit.beta / fit.alpha:,.0f}" if fit.alpha > 0 else "alpha = 0"
    return "\n".join(
        [
            f"# mixflow calibrate, {where.day.isoformat()}, {where.device}, torch {where.torch}, {where.dtype},"
            f" {where.attention} attention:",
            f"# hidden {where.hidden}, {where.heads} heads, {where.layers} layers, forward+backward;"
            " ms per sample of L tokens = alpha*L^2 + beta*L + gamma",
            f"# ({ratio}), plus {fit.per_micro_batch:.3g} ms per micro-batch (the same on every rank, not balanced).",
            f"cost: {{alpha: {yaml_float(fit.alpha)}, beta: {yaml_float(fit.beta)}, gamma: {yaml_float(fit.gamma)}}}",
        ]
    )


def fit_table(fit: CostFit) -> list[str]:
    """One line per micro-batch timed (median of its repeats, the fit's value, their spread), then R^2 and
    the worst relative error per sample length."""
    lines = [f"{'L':>7} {'samples':>8} {'measured ms':>12} {'fitted ms':>12} {'error':>7} {'spread':>7}"]
    for timing, error in zip(fit.timings, fit.relative_errors(), strict=True):
        median = timing.median_ms
        spread = (max(timing.ms) - min(timing.ms)) / median
        lines.append(
            f"{timing.shape.length:>7} {timing.shape.samples:>8} {median:>12.4g}"
            f" {fit.predicted_ms(timing.shape):>12.4g} {error:>+7.1%} {spread:>7.1%}"
        )
    worst = ", ".join(f"{length} {error:.1%}" for length, error in fit.worst_error_by_length().items())
    lines.append(f"R^2 {fit.r_squared():.5f}; worst relative error by length: {worst}")
    lines.append("(spread: (slowest - fastest) / median of the repeats)")
    return lines
