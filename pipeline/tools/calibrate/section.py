"""What ``mixflow calibrate`` prints: the fit's quality per micro-batch, and the spec's ``cost:`` section
(with ``--vision``, its ``vision:`` section too)."""

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


@dataclass(frozen=True)
class VisionPart:
    """The vision encoder's fit, per image or clip of ``n`` patches for all its ``layers``, and the shape of
    its block timed (full attention within each item)."""

    fit: CostFit
    hidden: int
    heads: int
    mlp: int
    layers: int
    attention: str


def yaml_float(value: float) -> str:
    """``value`` to 4 significant digits, spelled so that YAML 1.1 reads a float (``1.0e-07``, not ``1e-07``)."""
    mantissa, e, exponent = f"{value:.4g}".partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def _ratio(fit: CostFit) -> str:
    return f"beta/alpha = {fit.beta / fit.alpha:,.0f}" if fit.alpha > 0 else "alpha = 0"


def _coefficients(fit: CostFit) -> str:
    return f"{{alpha: {yaml_float(fit.alpha)}, beta: {yaml_float(fit.beta)}, gamma: {yaml_float(fit.gamma)}}}"


def cost_section(fit: CostFit, where: Provenance, vision: VisionPart | None = None) -> str:
    """The ``cost:`` section for the spec, with a comment saying what was measured on what; with ``vision``,
    its ``vision:`` section inside, in the same unit (ms), since the scheduler adds the two costs."""
    lines = [
        f"# mixflow calibrate, {where.day.isoformat()}, {where.device}, torch {where.torch}, {where.dtype},"
        f" {where.attention} attention:",
        f"# hidden {where.hidden}, {where.heads} heads, {where.layers} layers, forward+backward;"
        " ms per sample of L tokens = alpha*L^2 + beta*L + gamma",
        f"# ({_ratio(fit)}), plus {fit.per_micro_batch:.3g} ms per micro-batch (the same on every rank, not balanced).",
    ]
    if vision is None:
        return "\n".join([*lines, f"cost: {_coefficients(fit)}"])
    encoder = vision.fit
    return "\n".join(
        [
            *lines,
            f"# vision: the encoder's block, hidden {vision.hidden}, {vision.heads} heads, MLP {vision.mlp},"
            f" {vision.layers} layers, {vision.attention} attention,",
            "# full within each image or clip, forward+backward; ms per image or clip of n patches"
            " = alpha*n^2 + beta*n + gamma",
            f"# ({_ratio(encoder)}), plus {encoder.per_micro_batch:.3g} ms per micro-batch with images (not balanced);"
            " patch embedding and merger not timed.",
            "cost:",
            f"  alpha: {yaml_float(fit.alpha)}",
            f"  beta: {yaml_float(fit.beta)}",
            f"  gamma: {yaml_float(fit.gamma)}",
            f"  vision: {_coefficients(encoder)}",
        ]
    )


def fit_table(fit: CostFit, length: str = "L", count: str = "samples") -> list[str]:
    """One line per micro-batch timed (median of its repeats, the fit's value, their spread), then R^2 and
    the worst relative error per length. ``length`` and ``count`` head the first two columns (for
    the vision encoder: ``n`` patches, ``images``)."""
    lines = [f"{length:>7} {count:>8} {'measured ms':>12} {'fitted ms':>12} {'error':>7} {'spread':>7}"]
    for timing, error in zip(fit.timings, fit.relative_errors(), strict=True):
        median = timing.median_ms
        spread = (max(timing.ms) - min(timing.ms)) / median
        lines.append(
            f"{timing.shape.length:>7} {timing.shape.samples:>8} {median:>12.4g}"
            f" {fit.predicted_ms(timing.shape):>12.4g} {error:>+7.1%} {spread:>7.1%}"
        )
    worst = ", ".join(f"{n} {error:.1%}" for n, error in fit.worst_error_by_length().items())
    lines.append(f"R^2 {fit.r_squared():.5f}; worst relative error by length: {worst}")
    lines.append("(spread: (slowest - fastest) / median of the repeats)")
    return lines
