"""`mixflow calibrate`: the fit recovers known costs from noisy timings, and the command's section is a valid spec."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.planning.scheduler import CostModel
from pipeline.spec import CostSpec, SpecError, load_spec
from pipeline.spec.cost import VisionCostModel
from pipeline.tools.calibrate import CostFit, MicroBatchShape, Timing, calibration_grid, default_lengths, fit_cost
from pipeline.tools.calibrate.section import Provenance, VisionPart, cost_section, yaml_float

GPU_GRID = (default_lengths(65536, shortest=256), 65536)
CPU_GRID = (default_lengths(1024, shortest=64), 1024)
# The vision encoder's default on a GPU: images of 64 to 16384 patches, micro-batches of 16384 patches.
VISION_GRID = (default_lengths(16384, shortest=64), 16384)

SPEC_WITHOUT_COST = {
    "job": "t",
    "tokenizer": "tok.json",
    "sources": [{"name": "a", "reader": "jsonl", "path": "data/a"}],
    "mixture": {"weights": {"a": 1}},
    "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
}
VISION_IDS = {"image_token_id": 10, "video_token_id": 11, "vision_start_id": 12, "vision_end_id": 13}
MULTIMODAL_SPEC_WITHOUT_COST = {
    **SPEC_WITHOUT_COST,
    "sources": [{"name": "a", "reader": "jsonl", "path": "data/a", "vision": VISION_IDS}],
    "step": {**SPEC_WITHOUT_COST["step"], "patches_per_micro_batch": 4096},
}


def _timings(
    shapes: list[MicroBatchShape],
    truth: tuple[float, float, float, float],
    rng: np.random.Generator | None = None,
    noise: float = 0.0,
    repeats: int = 5,
) -> list[Timing]:
    """Times of ``samples * (alpha*L^2 + beta*L + gamma) + per_micro_batch``, each repeat off by a lognormal
    factor of sigma ``noise``, and one repeat of each shape three times slower (a busy moment)."""
    alpha, beta, gamma, fixed = truth
    timings = []
    for shape in shapes:
        true_ms = shape.samples * (alpha * shape.length**2 + beta * shape.length + gamma) + fixed
        ms = np.full(repeats, true_ms)
        if rng is not None:
            ms *= np.exp(rng.normal(0.0, noise, repeats))
            ms[rng.integers(repeats)] *= 3
        timings.append(Timing(shape, tuple(float(x) for x in ms)))
    return timings


def _per_sample(alpha: float, beta: float, gamma: float, lengths: np.ndarray) -> np.ndarray:
    return alpha * lengths**2 + beta * lengths + gamma


# -- the fit (numpy alone) ----------------------------------------------------------------------------------


def test_grid_times_a_full_and_a_half_micro_batch_per_length() -> None:
    assert calibration_grid([64, 16, 32, 32], 64) == [
        MicroBatchShape(16, 2),
        MicroBatchShape(16, 4),
        MicroBatchShape(32, 1),
        MicroBatchShape(32, 2),
        MicroBatchShape(64, 1),
    ]
    with pytest.raises(ValueError, match="at least 3 different lengths"):
        calibration_grid([16, 32, 32], 64)
    with pytest.raises(ValueError, match=r"length 128 is not within 1\.\.64"):
        calibration_grid([16, 32, 128], 64)


def test_fit_is_exact_without_noise() -> None:
    truth = (8.78e-8, 1.92e-3, 4e-3, 0.5)
    fit = fit_cost(_timings(calibration_grid(*GPU_GRID), truth))
    np.testing.assert_allclose([fit.alpha, fit.beta, fit.gamma, fit.per_micro_batch], truth, rtol=1e-9)
    assert fit.r_squared() == pytest.approx(1.0)
    assert max(fit.worst_error_by_length().values()) < 1e-9


@pytest.mark.parametrize("grid", [GPU_GRID, CPU_GRID, VISION_GRID], ids=["gpu-grid", "cpu-grid", "vision-grid"])
@pytest.mark.parametrize("seed", range(10))
def test_fit_recovers_known_costs_from_noisy_timings(grid: tuple[list[int], int], seed: int) -> None:
    lengths, tokens = grid
    shortest, longest = lengths[0], lengths[-1]
    rng = np.random.default_rng(seed)
    # Every term shows within the grid: attention and the linear layers cross over between the shortest and
    # the longest length, gamma is up to the linear cost of a shortest sample, the micro-batch's constant up
    # to a fifth of a full one's linear cost; gamma and that constant are 0 in some sets (the bound of the fit).
    alpha = 1e-7 * 10 ** rng.uniform(-2, 2)
    beta = alpha * np.exp(rng.uniform(np.log(shortest), np.log(longest)))
    gamma = beta * shortest * rng.uniform(0, 1) * (seed % 3 != 0)
    fixed = beta * tokens * rng.uniform(0, 0.2) * (seed % 4 != 0)
    timings = _timings(calibration_grid(lengths, tokens), (alpha, beta, gamma, fixed), rng, noise=0.005)

    fit = fit_cost(timings)

    assert min(fit.alpha, fit.beta, fit.gamma, fit.per_micro_batch) >= 0
    assert fit.alpha == pytest.approx(alpha, rel=0.04)
    assert fit.beta == pytest.approx(beta, rel=0.10)
    assert fit.gamma == pytest.approx(gamma, abs=0.10 * beta * shortest)
    assert fit.per_micro_batch == pytest.approx(fixed, abs=0.05 * beta * tokens)
    grid_lengths = np.array(lengths, dtype=np.float64)
    fitted = _per_sample(fit.alpha, fit.beta, fit.gamma, grid_lengths)
    np.testing.assert_allclose(fitted, _per_sample(alpha, beta, gamma, grid_lengths), rtol=0.03)
    assert fit.r_squared() > 0.999


@settings(max_examples=60, deadline=None)
@given(
    alpha=st.floats(1e-9, 1e-5),
    ratio=st.floats(64, 16384),  # beta / alpha: attention and the linear layers cross over within the grid
    gamma_share=st.floats(0, 1),
    fixed_share=st.floats(0, 0.2),
)
def test_the_vision_fit_recovers_any_encoder_exactly(
    alpha: float, ratio: float, gamma_share: float, fixed_share: float
) -> None:
    # An encoder's micro-batch of k items of n patches: k * (alpha*n^2 + beta*n + gamma) + its constant, the
    # same form as the LLM's; the fit over the vision grid gives back every coefficient, noise aside.
    lengths, patches = VISION_GRID
    beta = alpha * ratio
    truth = (alpha, beta, gamma_share * beta * lengths[0], fixed_share * beta * patches)
    fit = fit_cost(_timings(calibration_grid(lengths, patches), truth))
    recovered = (fit.alpha, fit.beta, fit.gamma, fit.per_micro_batch)
    np.testing.assert_allclose(recovered, truth, rtol=1e-6, atol=1e-9 * beta * lengths[0])
    assert fit.r_squared() == pytest.approx(1.0)


def test_one_slow_repeat_moves_nothing() -> None:
    shapes = calibration_grid(*CPU_GRID)
    truth = (2e-6, 1e-3, 0.01, 0.2)
    clean = fit_cost(_timings(shapes, truth))
    slowed = [Timing(t.shape, (*t.ms[:-1], 10 * t.ms[-1])) for t in _timings(shapes, truth)]
    assert fit_cost(slowed) == CostFit(clean.alpha, clean.beta, clean.gamma, clean.per_micro_batch, tuple(slowed))


@pytest.mark.parametrize("gamma", [-0.02, -0.002])
def test_fit_is_the_best_non_negative_one(gamma: float) -> None:
    # Less time per sample than alpha and beta alone: gamma would go below 0 unconstrained.
    shapes = calibration_grid(*CPU_GRID)
    fit = fit_cost(_timings(shapes, (1e-6, 1e-3, gamma, 0.1)))
    assert fit.gamma == 0.0 and min(fit.alpha, fit.beta, fit.per_micro_batch) > 0
    # Optimal under x >= 0 (KKT): the gradient of the relative squared error is 0 along every coefficient
    # above 0 and points up (>= 0) along every coefficient at 0.
    design = np.array([[s.samples * s.length**2, s.samples * s.length, s.samples, 1.0] for s in shapes])
    measured = np.array([t.median_ms for t in fit.timings])
    relative = design / measured[:, None]
    coefficients = np.array([fit.alpha, fit.beta, fit.gamma, fit.per_micro_batch])
    gradient = 2 * relative.T @ (relative @ coefficients - 1) * np.linalg.norm(relative, axis=0) ** -1
    assert np.all(np.abs(gradient[coefficients > 0]) < 1e-9)
    assert np.all(gradient[coefficients == 0] > -1e-9)


def test_fit_refuses_timings_it_cannot_separate() -> None:
    shapes = [MicroBatchShape(64, n) for n in (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="cannot tell alpha, beta, gamma apart"):
        fit_cost(_timings(shapes, (1e-6, 1e-3, 0.0, 0.0)))
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_cost([Timing(MicroBatchShape(64, 1), (1.0, float("nan")))])


def test_scaled_fit_is_every_coefficient_times_layers() -> None:
    fit = fit_cost(_timings(calibration_grid(*CPU_GRID), (2e-6, 1e-3, 0.01, 0.2)))
    scaled = fit.scaled(32)
    assert (scaled.alpha, scaled.beta, scaled.gamma) == (32 * fit.alpha, 32 * fit.beta, 32 * fit.gamma)
    assert scaled.r_squared() == pytest.approx(fit.r_squared())


@pytest.mark.parametrize("value", [1e-7, 8.78e-8, 0.0, 123456.0, 0.00192, 2.0, 1.5e30])
def test_yaml_float_reads_back_as_a_float(value: float) -> None:
    read = yaml.safe_load(f"x: {yaml_float(value)}")["x"]
    assert isinstance(read, float) and read == pytest.approx(value, rel=1e-3)


def test_a_section_with_vision_is_a_cost_section_with_the_encoders_coefficients(tmp_path: Path) -> None:
    llm = fit_cost(_timings(calibration_grid(*CPU_GRID), (2e-6, 1e-3, 0.01, 0.2)))
    encoder = fit_cost(_timings(calibration_grid(*VISION_GRID), (3e-8, 4e-4, 0.002, 0.1)))
    where = Provenance("H100", "2.11", "bf16", "varlen", 4096, 32, 32, date(2026, 11, 27))
    text_only = cost_section(llm, where)
    section = cost_section(llm, where, VisionPart(encoder.scaled(32), 1280, 16, 5120, 32, "varlen"))
    assert section.startswith(text_only.rsplit("\n", 1)[0] + "\n# vision: the encoder's block, hidden 1280, 16 heads")
    cost = yaml.safe_load(section)["cost"]
    assert cost == yaml.safe_load(text_only)["cost"] | {"vision": cost["vision"]}
    assert cost["vision"] == pytest.approx({"alpha": 32 * 3e-8, "beta": 32 * 4e-4, "gamma": 32 * 0.002}, rel=1e-3)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(MULTIMODAL_SPEC_WITHOUT_COST, sort_keys=False) + section + "\n")
    vision = load_spec(path).cost.vision_cost_model()
    assert vision == VisionCostModel(cost["vision"]["alpha"], cost["vision"]["beta"], cost["vision"]["gamma"])


# -- the cost model and the spec ------------------------------------------------------------------------------


def test_cost_model_gamma_adds_per_sample_and_zero_changes_nothing() -> None:
    lengths = np.array([1, 7, 4096, 65536], dtype=np.int64)
    as_float = lengths.astype(np.float64)
    plain = CostModel(alpha=3.0, beta=5.0)
    np.testing.assert_array_equal(plain.costs(lengths), (3.0 * as_float) * as_float + 5.0 * as_float)
    assert plain.costs(lengths).tobytes() == CostModel(3.0, 5.0, gamma=0.0).costs(lengths).tobytes()
    np.testing.assert_array_equal(CostModel(3.0, 5.0, 11.0).costs(lengths), plain.costs(lengths) + 11.0)
    with pytest.raises(ValueError, match="gamma must be a finite number >= 0"):
        CostModel(1.0, 1.0, gamma=-1.0)


def test_cost_spec_gamma() -> None:
    assert CostSpec(alpha=1.0, beta=2.0, gamma=3.0).cost_model() == CostModel(1.0, 2.0, 3.0)
    assert CostSpec(alpha=1.0, beta=2.0).cost_model() == CostModel(1.0, 2.0, 0.0)
    assert CostSpec(hidden_size=64, num_layers=2).cost_model() == CostModel.from_transformer(64, 2)


@pytest.mark.parametrize(
    ("cost", "problem"),
    [
        ({"alpha": 1.0, "beta": 2.0, "gamma": -1.0}, "cost.gamma: Input should be greater than or equal to 0"),
        ({"hidden_size": 64, "num_layers": 2, "gamma": 1.0}, "cost: give either alpha/beta or hidden_size"),
        ({"gamma": 1.0}, "cost.alpha: required with gamma"),
    ],
)
def test_cost_spec_refuses_a_bad_gamma(tmp_path: Path, cost: dict, problem: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC_WITHOUT_COST, "cost": cost}))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert any(problem in str(p) for p in info.value.problems), str(info.value)


# -- the block and the command (torch, on the CPU) ------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["llm-causal", "vision-full"])
@pytest.mark.parametrize("lengths", [(5, 5, 5), (1, 7, 3, 9), (12,)])
def test_block_attends_within_each_sample(lengths: tuple[int, ...], causal: bool) -> None:
    torch = pytest.importorskip("torch")
    from pipeline.tools.calibrate.block import SDPA, Block

    torch.manual_seed(0)
    block = Block(hidden=32, heads=4, attention=SDPA, causal=causal)
    q, k, v = (torch.randn(sum(lengths), 4, 8) for _ in range(3))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    out = block._attend(q, k, v, torch.tensor(bounds, dtype=torch.int32), max(lengths))
    for start, n in zip(bounds[:-1].tolist(), lengths, strict=True):
        rows = slice(start, start + n)
        scores = torch.einsum("ihd,jhd->hij", q[rows], k[rows]) / 8**0.5
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        expected = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v[rows])
        torch.testing.assert_close(out[rows], expected)


def test_the_vision_blocks_varlen_attention_is_full_within_each_item() -> None:
    pytest.importorskip("torch")
    from pipeline.tools.calibrate.block import varlen_attention
    from trainer_sink.attention import causal_varlen_attn

    found = causal_varlen_attn()
    if found is None:
        assert varlen_attention(causal=False) is None
        return
    varlen_attn, full = varlen_attention(causal=False)
    assert varlen_attn is found[0] and full in ({"is_causal": False}, {"window_size": (-1, -1)})
    assert varlen_attention(causal=True) == found


def test_a_planned_micro_batch_of_mixed_lengths_is_timed() -> None:
    torch = pytest.importorskip("torch")
    from pipeline.tools.calibrate.block import SDPA, Block
    from pipeline.tools.calibrate.timing import time_micro_batch

    block = Block(hidden=32, heads=4, attention=SDPA)
    assert time_micro_batch(block, [3, 40, 1, 17], torch.device("cpu"), torch.float32) > 0


def test_calibrate_prints_a_section_the_spec_accepts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "cost.yaml"
    argv = ["calibrate", "--device", "cpu", "--hidden", "64", "--heads", "4", "--layers", "2"]
    argv += ["--lengths", "16", "32", "64", "--repeats", "2", "--warmups", "1", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "round 3/3 (timed)" in printed.err
    assert re.search(r"^R\^2 -?[0-9.]+; worst relative error by length: 16 [0-9.]+%, 32 ", printed.out, re.M)
    section = printed.out[printed.out.index("# mixflow calibrate") :].strip()
    assert section == out.read_text().strip()
    comment, cost_line = section.splitlines()[:3], section.splitlines()[3]
    assert "hidden 64, 4 heads, 2 layers" in comment[1] and "fp32, sdpa attention" in comment[0]
    assert re.fullmatch(r"cost: \{alpha: \S+, beta: \S+, gamma: \S+\}", cost_line)

    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC_WITHOUT_COST, sort_keys=False) + section + "\n")
    cost = load_spec(spec_path).cost
    written = yaml.safe_load(section)["cost"]
    assert (cost.alpha, cost.beta, cost.gamma) == (written["alpha"], written["beta"], written["gamma"])
    assert cost.cost_model() == CostModel(written["alpha"], written["beta"], written["gamma"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--hidden", "100", "--heads", "3"], "--hidden 100 is not a multiple of --heads 3"),
        (["--lengths", "16", "32"], "--lengths 16 32 with --tokens 32: need at least 3 different lengths"),
        (
            ["--lengths", "16", "32", "64", "--tokens", "32"],
            "--lengths 16 32 64 with --tokens 32: length 64 is not within 1..32",
        ),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ],
)
def test_calibrate_names_a_bad_argument(extra: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    assert main(["calibrate", "--device", "cpu", *extra]) == 2
    assert f"mixflow calibrate: error: {message}" in capsys.readouterr().err


def test_calibrate_vision_prints_a_section_spec_check_accepts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    argv = ["calibrate", "--device", "cpu", "--hidden", "32", "--heads", "2", "--layers", "2"]
    argv += ["--lengths", "8", "16", "32", "--repeats", "1", "--warmups", "1", "--threads", "1", "--vision"]
    argv += ["--vision-hidden", "32", "--vision-heads", "2", "--vision-mlp", "48", "--vision-layers", "3"]
    argv += ["--vision-patches", "8", "16", "32", "--vision-micro-batch", "64"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "timing the vision encoder's block (hidden 32, 2 heads, MLP 48, fp32) on cpu" in printed.err
    assert re.search(r"^      n   images  measured ms", printed.out, re.M)
    assert re.search(r"^     32        2 ", printed.out, re.M)  # 64 patches a micro-batch: two images of 32
    section = printed.out[printed.out.index("# mixflow calibrate") :].strip()
    assert "# vision: the encoder's block, hidden 32, 2 heads, MLP 48, 3 layers, sdpa attention," in section
    assert re.search(r"^  vision: \{alpha: \S+, beta: \S+, gamma: \S+\}$", section, re.M)

    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(MULTIMODAL_SPEC_WITHOUT_COST, sort_keys=False) + section + "\n")
    assert main(["spec", "check", str(spec_path)]) == 0
    assert capsys.readouterr().out.startswith("ok: t (1 sources")
    written = yaml.safe_load(section)["cost"]
    cost = load_spec(spec_path).cost
    assert cost.cost_model() == CostModel(written["alpha"], written["beta"], written["gamma"])
    assert cost.vision_cost_model() == VisionCostModel(**written["vision"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--vision-hidden", "100", "--vision-heads", "3"],
            "--vision-hidden 100 is not a multiple of --vision-heads 3",
        ),
        (["--vision-layers", "0"], "--vision-layers must be >= 1, got 0"),
        (["--vision-patches", "16", "32"], "--vision-patches 16 32 with --vision-micro-batch 32: need at least 3"),
        (
            ["--vision-patches", "16", "32", "64", "--vision-micro-batch", "32"],
            "--vision-patches 16 32 64 with --vision-micro-batch 32: length 64 is not within 1..32",
        ),
    ],
)
def test_calibrate_names_a_bad_vision_argument(extra: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    argv = ["calibrate", "--device", "cpu", "--lengths", "8", "16", "32", "--vision", *extra]
    assert main(argv) == 2
    assert f"mixflow calibrate: error: {message}" in capsys.readouterr().err
