"""`mixflow plan` end to end through pipeline.cli.main."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.cli.plan_context_parallel import read_cost_section
from pipeline.planning.scheduler import CostModel, StepPlan, plan_step, plan_with_media, validate_plan
from pipeline.planning.scheduler.context_parallel import CPMode, CPPlan, CPShape, plan_cp_step, validate_cp_plan
from pipeline.planning.shape import StepShape


def _args(lengths: Path, out: Path, *extra: str) -> list[str]:
    return [
        "plan",
        "--lengths",
        str(lengths),
        "--ranks",
        "4",
        "--micro-batches",
        "2",
        "--capacity",
        "4096",
        "--out",
        str(out),
        *extra,
    ]


def test_plan_writes_assignment_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lengths = np.random.default_rng(0).integers(1, 2000, 40).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--alpha", "1", "--beta", "100")) == 0
    with np.load(tmp_path / "plan.npz") as saved:
        rank, micro = saved["rank"], saved["micro"]
    assert rank.dtype == np.int32 and micro.dtype == np.int32 and rank.shape == lengths.shape
    validate_plan(StepPlan(rank, micro, ranks=4, micro_batches=2, capacity=4096), lengths)
    # The file holds the scheduler's plan for the arguments given (ranks, micro-batches, capacity, alpha, beta).
    expected = plan_step(lengths, 4, 2, 4096, CostModel(alpha=1.0, beta=100.0))
    np.testing.assert_array_equal(rank, expected.rank)
    np.testing.assert_array_equal(micro, expected.micro)

    # The summary printed describes the plan in the file, recomputed here from it with numpy alone: about
    # 39k tokens for 32k of capacity, so some samples wait, and costs are exact integers in float64.
    placed = rank >= 0
    assert 0 < placed.sum() < lengths.size
    costs = lengths.astype(np.float64) ** 2 + 100 * lengths
    micro_costs = np.zeros((4, 2))
    np.add.at(micro_costs, (rank[placed], micro[placed]), costs[placed])
    rank_costs = micro_costs.sum(axis=1)
    busy = rank_costs > 0
    micro_imbalance = (micro_costs[busy].max(axis=1) / (rank_costs[busy] / 2)).max()
    lower_bound = max(costs[placed].sum() / 4, costs[placed].max())
    tokens = int(lengths[placed].sum())
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:-1] == [
        f"samples=40 placed={placed.sum()} deferred={(~placed).sum()}",
        f"tokens placed={tokens} / capacity=32768 ({tokens / 32768:.2%})",
        f"max rank cost={rank_costs.max():.6g} / lower bound={lower_bound:.6g}"
        f" (ratio {rank_costs.max() / lower_bound:.4f})",
        f"micro-batch imbalance={micro_imbalance:.4f}",
    ]
    assert re.fullmatch(r"plan_seconds=\d+\.\d{6}", lines[-1]), lines[-1]


@pytest.mark.parametrize(
    ("content", "extra", "message", "code"),
    [
        (None, (), "no such file", 4),
        (np.array([1.5, 2.0]), (), "int64", 2),
        (np.array([1, 5000], np.int64), (), "lengths[1] = 5000 exceeds capacity 4096", 2),
        (np.array([1, 2], np.int64), ("--alpha", "-1"), "alpha", 2),
    ],
)
def test_plan_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: np.ndarray | None, extra: tuple, message: str, code: int
) -> None:
    path = tmp_path / "lengths.npy"
    if content is not None:
        np.save(path, content)
    assert main(_args(path, tmp_path / "plan.npz", *extra)) == code
    err = capsys.readouterr().err
    assert "mixflow plan: error:" in err and message in err and "Traceback" not in err


def _cp_args(lengths: Path, out: Path, mode: str, *extra: str) -> list[str]:
    return [
        "plan",
        "--lengths",
        str(lengths),
        "--ranks",
        "8",
        "--micro-batches",
        "2",
        "--max-tokens-per-rank",
        "2048",
        "--context-parallel",
        mode,
        "--out",
        str(out),
        *extra,
    ]


COST_SECTION = """
cost:
  hidden_size: 1024
  num_layers: 8
  context_parallel: {kv_heads: 4, head_dim: 64, tflops: 100, nvlink_gb_s: 200, network_gb_s: 20, ranks_per_node: 4}
"""


@pytest.mark.parametrize(
    ("mode", "shape_mode", "size"),
    [
        ("static:4", "static", 4),
        ("aligned", "aligned", 8),
        ("aligned:4", "aligned", 4),
        ("free", "free", 8),
        ("free:6", "free", 6),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_context_parallel_writes_the_planners_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture, mode: str, shape_mode: str, size: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(600), 1.3, 80), 1, 7000).astype(np.int64)
    lengths[rng.integers(0, 80)] = 7000  # a sample that must span 4 ranks or more
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "spec.yaml").write_text(COST_SECTION)
    args = _cp_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", mode, "--cost", str(tmp_path / "spec.yaml"))
    assert main(args) == 0
    with np.load(tmp_path / "plan.npz") as saved:
        rank, micro, cp = saved["rank"], saved["micro"], saved["cp"]
    shape = CPShape(8, 2, 2048, CPMode(shape_mode), size)
    cost = read_cost_section(tmp_path / "spec.yaml").context_parallel_cost()
    assert cost.kv_heads == 4 and cost.ranks_per_node == 4 and cost.flops_per_s == 100e12
    expected = plan_cp_step(lengths, shape, cost)
    np.testing.assert_array_equal(rank, expected.rank)
    np.testing.assert_array_equal(micro, expected.micro)
    np.testing.assert_array_equal(cp, expected.cp)
    validate_cp_plan(CPPlan(rank, cp, micro, shape), lengths)
    placed = rank >= 0
    if shape_mode != "free":
        assert ((rank[placed] % cp[placed]) == 0).all() and (cp[placed] & (cp[placed] - 1) == 0).all()
    out = capsys.readouterr().out
    assert f"samples=80 placed={placed.sum()} deferred={(~placed).sum()}" in out
    sizes = " ".join(f"{c}x{(cp[placed] == c).sum()}" for c in sorted(set(cp[placed].tolist())))
    assert f"cp sizes: {sizes}\n" in out
    assert f"tokens/s={expected.tokens_per_second(lengths, cost):.6g}\n" in out


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        ("static", (), "static needs its size"),
        ("ring:4", (), "the mode is static:C, aligned[:C] or free[:C]"),
        ("aligned:3", (), "must be a power of two"),
        ("free:9", (), "more than the step's 8 ranks"),
        ("aligned:2", (), "lengths[3] = 9000 does not fit a block: on 2 ranks (aligned mode)"),
        ("free", ("--alpha", "2"), "give --cost or --alpha/--beta, not both"),
    ],
)
def test_plan_context_parallel_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture, mode: str, extra: tuple, message: str
) -> None:
    np.save(tmp_path / "lengths.npy", np.array([10, 900, 30, 9000], np.int64))
    (tmp_path / "cost.yaml").write_text("hidden_size: 1024\nnum_layers: 4\n")
    args = _cp_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", mode, "--cost", str(tmp_path / "cost.yaml"))
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("hidden_size: 1024\nnum_layers: 4\ncontext_parallel: {kv_heads: 0}\n", "cost.context_parallel.kv_heads"),
        ("cost: [1, 2]\n", "must hold a cost section"),
        ("alpha: 1\nbeta: 2\nwarp: 3\n", "cost.warp"),
    ],
)
def test_a_bad_cost_file_is_refused_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str, message: str
) -> None:
    np.save(tmp_path / "lengths.npy", np.array([10, 900], np.int64))
    (tmp_path / "cost.yaml").write_text(content)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--cost", str(tmp_path / "cost.yaml"))) == 2
    assert message in capsys.readouterr().err


def test_a_cost_file_plans_a_step_without_context_parallelism_by_its_model(tmp_path: Path) -> None:
    lengths = np.random.default_rng(3).integers(1, 2000, 40).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "cost.yaml").write_text("alpha: 1\nbeta: 100\n")
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--cost", str(tmp_path / "cost.yaml"))) == 0
    expected = plan_step(lengths, 4, 2, 4096, CostModel(alpha=1.0, beta=100.0))
    with np.load(tmp_path / "plan.npz") as saved:
        np.testing.assert_array_equal(saved["rank"], expected.rank)
        assert "cp" not in saved.files


# Pools of samples with vision patches: (tokens, patches) drawn per family, a share of them text (0 patches).
MEDIA_FAMILIES = ("uniform", "long_text_and_images", "patches_follow_tokens", "all_media", "all_text")


def _media_pool(family: str, seed: int, n: int, capacity: int, patch_capacity: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, capacity + 1, n)
    patches = rng.integers(0, patch_capacity + 1, n)
    if family == "long_text_and_images":  # text near a micro-batch long, images short in tokens
        text = rng.random(n) < 0.5
        tokens = np.where(text, rng.integers(capacity // 2, capacity + 1, n), rng.integers(1, capacity // 4 + 2, n))
        patches = np.where(text, 0, rng.integers(1, patch_capacity + 1, n))
    elif family == "patches_follow_tokens":  # a sample's tokens are mostly its image's
        patches = np.minimum(tokens * patch_capacity // capacity, patch_capacity)
    elif family == "all_media":
        patches = rng.integers(1, patch_capacity + 1, n)
    elif family == "all_text":
        patches = np.zeros(n, np.int64)
    if family == "uniform":
        patches[rng.random(n) < 0.3] = 0
    return tokens.astype(np.int64), patches.astype(np.int64)


VISION_COST = """
cost:
  alpha: 2
  beta: 300
  vision: {alpha: 5, beta: 40, gamma: 1000}
"""


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(MEDIA_FAMILIES),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 120),
    ranks=st.integers(1, 6),
    micro_batches=st.integers(1, 3),
    patch_capacity=st.integers(1, 3000),
    vision=st.sampled_from(("none", "options", "cost file")),
)
def test_plan_with_patches_writes_the_constructors_plan(
    tmp_path_factory: pytest.TempPathFactory,
    family: str,
    seed: int,
    n: int,
    ranks: int,
    micro_batches: int,
    patch_capacity: int,
    vision: str,
) -> None:
    folder = tmp_path_factory.mktemp("media")
    capacity = 2048
    lengths, patches = _media_pool(family, seed, n, capacity, patch_capacity)
    np.save(folder / "lengths.npy", lengths)
    np.save(folder / "patches.npy", patches)
    (folder / "cost.yaml").write_text(VISION_COST)
    args = ["plan", "--lengths", str(folder / "lengths.npy"), "--patches", str(folder / "patches.npy")]
    args += ["--patch-capacity", str(patch_capacity), "--ranks", str(ranks), "--micro-batches", str(micro_batches)]
    args += ["--capacity", str(capacity), "--out", str(folder / "plan.npz")]
    # The encoder's cost of each sample, its patches one image: alpha*n^2 + beta*n + gamma, 0 without patches.
    as_float = patches.astype(np.float64)
    if vision == "none":  # as a spec without cost.vision: only the patch budget binds
        llm, encoder = CostModel(alpha=1.0, beta=100.0), np.zeros(n)
        args += ["--alpha", "1", "--beta", "100"]
    elif vision == "options":
        llm, encoder = CostModel(alpha=1.0, beta=100.0), np.where(patches > 0, 3 * as_float**2 + 70 * as_float, 0.0)
        args += ["--alpha", "1", "--beta", "100", "--vision-alpha", "3", "--vision-beta", "70"]
    else:
        llm = CostModel(alpha=2.0, beta=300.0)
        encoder = np.where(patches > 0, 5 * as_float**2 + 40 * as_float + 1000, 0.0)
        args += ["--cost", str(folder / "cost.yaml")]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(args) == 0
    with np.load(folder / "plan.npz") as saved:
        rank, micro = saved["rank"], saved["micro"]
        llm_rank_cost, encoder_rank_cost = saved["llm_rank_cost"], saved["encoder_rank_cost"]

    # The file holds the constructor's plan of these samples: plan_with_media as the step core calls it.
    shape = StepShape(ranks, micro_batches, capacity, patch_capacity)
    expected = plan_with_media(lengths, shape, llm, None, patches, encoder, True)
    np.testing.assert_array_equal(rank, expected.rank)
    np.testing.assert_array_equal(micro, expected.micro)

    # Checked with numpy alone: each sample in one micro-batch or none, every micro-batch within both capacities.
    assert rank.dtype == np.int32 and micro.dtype == np.int32 and rank.shape == micro.shape == (n,)
    placed = rank >= 0
    assert ((rank < 0) == (micro < 0)).all() and (rank < ranks).all() and (micro < micro_batches).all()
    tokens, held = np.zeros((ranks, micro_batches), np.int64), np.zeros((ranks, micro_batches), np.int64)
    np.add.at(tokens, (rank[placed], micro[placed]), lengths[placed])
    np.add.at(held, (rank[placed], micro[placed]), patches[placed])
    assert tokens.max(initial=0) <= capacity and held.max(initial=0) <= patch_capacity
    if n and n <= ranks * micro_batches:  # room for every sample alone: none waits
        assert placed.all()

    # Each rank's LLM and encoder cost, and the summary's encoder line from them.
    llm_costs = llm.alpha * lengths.astype(np.float64) ** 2 + llm.beta * lengths
    np.testing.assert_allclose(llm_rank_cost, np.bincount(rank[placed], llm_costs[placed], ranks), rtol=1e-12)
    np.testing.assert_allclose(encoder_rank_cost, np.bincount(rank[placed], encoder[placed], ranks), rtol=1e-12)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"samples={n} placed={placed.sum()} deferred={(~placed).sum()}"
    room = ranks * micro_batches * patch_capacity
    placed_patches = int(patches[placed].sum())
    assert lines[2] == f"patches placed={placed_patches} / capacity={room} ({placed_patches / room:.2%})"
    mean = encoder_rank_cost.mean()
    ratio = encoder_rank_cost.max() / mean if mean > 0 else 1.0
    assert f"encoder max rank cost={encoder_rank_cost.max():.6g} / mean={mean:.6g} (ratio {ratio:.4f})" in lines


MEDIA_LENGTHS = np.array([100, 200, 300, 400], np.int64)


@pytest.mark.parametrize(
    ("patches", "extra", "message"),
    [
        (np.array([0, 5, 9, 1]), ("--context-parallel", "free", "--patch-capacity", "10"), "with --context-parallel"),
        (np.array([0, 5, 9, 1]), (), "--patches needs --patch-capacity"),
        (None, ("--patch-capacity", "10"), "--patch-capacity plan samples with vision patches: give --patches"),
        (None, ("--vision-alpha", "1", "--vision-beta", "2"), "give --patches"),
        (np.array([0, 5, 9, 1]), ("--patch-capacity", "10", "--vision-alpha", "1"), "--vision-beta together"),
        (np.array([0, 5, 9]), ("--patch-capacity", "10"), "patches.npy holds patches of shape (3,)"),
        (np.array([[0, 5], [9, 1]]), ("--patch-capacity", "10"), "patches.npy holds patches of shape (2, 2)"),
        (np.array([0, 5, -9, 1]), ("--patch-capacity", "10"), "patches.npy: patches[2] = -9 is below 0"),
        (np.array([0, 5, 9, 11]), ("--patch-capacity", "10"), "patches.npy: patches[3] = 11 exceeds --patch-capacity"),
        (np.array([0.0, 5, 9, 1]), ("--patch-capacity", "10"), "patches.npy must hold int64 patches, got float64"),
        (
            np.array([0, 5, 9, 1]),
            ("--patch-capacity", "10", "--vision-alpha", "-1", "--vision-beta", "2"),
            "--vision-alpha/--vision-beta: alpha must be a finite number >= 0",
        ),
        (
            np.array([0, 5, 9, 1]),
            ("--patch-capacity", "10", "--cost", "COST", "--vision-alpha", "1", "--vision-beta", "2"),
            "give --cost or --vision-alpha/--vision-beta, not both",
        ),
        (np.array([0, 5, 9, 1]), ("--patch-capacity", "0"), "must be above 0"),
    ],
)
def test_plan_with_patches_refuses_what_makes_no_sense(
    tmp_path: Path, capsys: pytest.CaptureFixture, patches: np.ndarray | None, extra: tuple, message: str
) -> None:
    np.save(tmp_path / "lengths.npy", MEDIA_LENGTHS)
    (tmp_path / "cost.yaml").write_text(VISION_COST)
    given = () if patches is None else ("--patches", str(tmp_path / "patches.npy"))
    if patches is not None:
        np.save(tmp_path / "patches.npy", patches)
    extra = tuple(str(tmp_path / "cost.yaml") if part == "COST" else part for part in extra)
    assert main(_args(tmp_path / "lengths.npy", tmp_path / "plan.npz", *given, *extra)) == 2
    err = capsys.readouterr().err
    assert "mixflow plan: error:" in err and message in err and "Traceback" not in err, err
    assert err.count("error:") == 1 and err.strip().splitlines()[-1].startswith("mixflow plan: error:"), err
    assert not (tmp_path / "plan.npz").exists()


def test_a_missing_patches_file_is_not_found(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "lengths.npy", MEDIA_LENGTHS)
    args = _args(tmp_path / "lengths.npy", tmp_path / "plan.npz", "--patches", str(tmp_path / "nowhere.npy"))
    assert main([*args, "--patch-capacity", "10"]) == 4
    assert "no such file" in capsys.readouterr().err
