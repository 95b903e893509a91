"""The long-context example: ``examples/train_long_context.py`` trains the example GPT on a context-parallel job's
slices over 4 gloo processes. Its loss and gradients over the slices of real planned steps equal the model's
over the whole samples; its check of what arrived finds a lost, repeated or changed slice; and the example runs
end to end under ``mixflow run``, the loss falling, every sample arriving once, token for token, and the run's
report finding the trainer's micro-batches as the rank topics hold them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.loader_support import REPO, build_example_data, example_body
from tests.ports import free_port
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_slices import slice_of
from topics.formats.sample import Sample
from trainer_sink.cp_tensors import cp_micro_batch_tensors

EXAMPLES = REPO / "examples"
sys.path.insert(0, str(EXAMPLES))
import cp_attention  # noqa: E402  (examples/ is not a package)
import cp_delivery  # noqa: E402
import gpt  # noqa: E402

RANKS, CAPACITY, VOCAB = 4, 64, 97
MODES = ("aligned", "free")


def _model() -> gpt.GPT:
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2)).double()


def _cases() -> list[tuple[str, list[CPBatch], list[Sample]]]:
    """Steps planned by the constructor's own functions, each with long samples that must span 2 or 4 ranks."""
    cases = []
    for mode in MODES:
        for seed in range(3):
            rng = np.random.default_rng([seed, len(mode)])
            lengths = np.clip(rng.lognormal(np.log(12), 0.8, 16), 2, RANKS * CAPACITY - 8).astype(np.int64)
            lengths[:2] = (2 * CAPACITY + rng.integers(0, 40), CAPACITY + rng.integers(1, 30))
            samples = [Sample(f"s/{i}", "s", rng.integers(0, VOCAB, n).astype(np.int32)) for i, n in enumerate(lengths)]
            plan = plan_cp_step(lengths, CPShape(RANKS, 2, CAPACITY, CPMode(mode), RANKS), ContextParallelCost())
            placed = [s for s, p in zip(samples, plan.placed_mask, strict=True) if p]
            cases.append((mode, build_cp_batches(0, plan, samples), placed))
    return cases


def _flat_grads(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()


def _whole(samples: list[Sample]) -> tuple[float, np.ndarray]:
    """The loss (per loss token) and gradients of the model over the whole samples, packed, with its own
    attention."""
    model = _model()
    tokens = [torch.from_numpy(s.tokens.astype(np.int64)) for s in samples]
    labels = torch.cat([torch.cat([t[1:], torch.tensor([-100])]) for t in tokens])
    lengths = torch.tensor([t.numel() for t in tokens])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).int()
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
    logits = model(torch.cat(tokens), positions, cu_seqlens, int(lengths.max()))
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    count = int((labels != -100).sum())
    (loss / count).backward()
    return float(loss.detach()) / count, _flat_grads(model)


def _rank(rank: int, port: int, cases: list, out: dict) -> None:
    sys.path.insert(0, str(EXAMPLES))
    import train_long_context

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    try:
        torch.set_num_threads(1)
        groups = {mode: cp_attention.BlockGroups(mode, RANKS, RANKS) for mode in MODES}
        for case, (mode, batches, _) in enumerate(cases):
            model = _model()
            total = torch.zeros(1, dtype=torch.float64)
            for micro in cp_micro_batch_tensors(batches[rank]):
                if micro["input_ids"].numel():
                    loss = train_long_context.micro_batch_loss(model, micro, groups[mode], rank)
                    (loss / micro["loss_tokens"]).backward()
                    total += loss.detach()
            train_long_context.all_reduce_gradients(model)
            dist.all_reduce(total)
            out[(case, rank)] = (float(total) / batches[rank].loss_tokens, _flat_grads(model))
    finally:
        dist.destroy_process_group()


def test_training_on_the_slices_of_planned_steps_is_training_on_the_whole_samples() -> None:
    cases = _cases()
    sizes = {int(c) for _, batches, _ in cases for b in batches for c in b.cp_size}
    assert {1, 2, 3, 4} <= sizes, f"the steps do not use blocks of 1, 2, 3 (free) and 4 ranks: {sizes}"
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(free_port(), cases, out), nprocs=RANKS, join=True)
        results = dict(out)
    for case, (mode, _, samples) in enumerate(cases):
        loss, grads = _whole(samples)
        for rank in range(RANKS):
            got_loss, got_grads = results[(case, rank)]
            assert got_loss == pytest.approx(loss, rel=1e-10), (mode, case, rank)
            np.testing.assert_allclose(got_grads, grads, rtol=1e-8, atol=1e-12, err_msg=f"{mode} {case} {rank}")


def test_every_block_layout_is_a_run_of_consecutive_ranks_of_its_mode() -> None:
    for world in (4, 8, 16):
        for size in (1, 2, 4, 8):
            aligned = cp_attention.block_layouts("aligned", size, world)
            assert all(first % c == 0 and c & (c - 1) == 0 and 1 < c <= size for first, c in aligned)
            assert len(aligned) == sum(world // (1 << e) for e in range(1, size.bit_length()) if 1 << e <= size)
            static = cp_attention.block_layouts("static", size, world)
            assert static == ([(f, size) for f in range(0, world - size + 1, size)] if size > 1 else [])
            free = cp_attention.block_layouts("free", size, world)
            assert set(aligned) | set(static) <= set(free)
            assert all(first + c <= world for first, c in free) and len(free) == len(set(free))


def _slices(seed: int) -> tuple[list[cp_delivery.Slice], dict[str, np.ndarray]]:
    """Samples of random lengths on random aligned blocks of 4 ranks, each rank's slice of each."""
    rng = np.random.default_rng(seed)
    sources, slices = {}, []
    for i in range(20):
        tokens = rng.integers(0, 1000, int(rng.integers(1, 300))).astype(np.int32)
        sources[f"src/{i}"] = tokens
        c = int(rng.choice([1, 2, 4]))
        first = int(rng.integers(0, RANKS // c)) * c
        for place in range(c):
            part, _, _ = slice_of(tokens, c, place)
            slices.append(cp_delivery.Slice(first + place, 0, i, f"src/{i}", c, place, tokens.size, part))
    return slices, sources


@pytest.mark.parametrize("seed", range(4))
def test_the_delivery_check_finds_a_lost_repeated_or_changed_slice(seed: int) -> None:
    slices, sources = _slices(seed)
    check = cp_delivery.check_delivery(slices, sources, to_the_end=True)
    assert check.ok and check.samples == len(sources) == check.by_block.total(), check.line()
    rng = np.random.default_rng(seed)
    k = int(rng.integers(len(slices)))
    changed = slices[k].tokens.copy()
    changed[int(rng.integers(changed.size))] += 1
    broken = {
        "lost": slices[:k] + slices[k + 1 :],
        "repeated": [*slices, slices[k]],
        "changed": [*slices[:k], cp_delivery.Slice(**{**vars(slices[k]), "tokens": changed}), *slices[k + 1 :]],
    }
    for how, pieces in broken.items():
        found = cp_delivery.check_delivery(pieces, sources, to_the_end=True)
        assert not found.ok and slices[k].sample_id in found.line(), (how, found.line())
    extra = cp_delivery.check_delivery(slices, {**sources, "src/extra": np.arange(3)}, to_the_end=True)
    assert not extra.ok and "never arrived" in extra.line()
    assert cp_delivery.check_delivery(slices, {**sources, "src/extra": np.arange(3)}, to_the_end=False).ok


TRAINER = (
    "{python} -m torch.distributed.run --standalone --nproc_per_node 4 examples/train_long_context.py "
    "--spec {spec} --out {out} --threads 1 --d-model 32 --layers 1 --heads 2 --vocab-size 1024 --log-every-s 0"
)


def _spec(tmp_path: Path, data: Path, job: str, bootstrap: str) -> Path:
    """examples/long_context.yaml on the small data, each rank holding 512 tokens (samples up to 2,048)."""
    body = example_body("long_context.yaml", data, job, bootstrap, "tokenizer.json")
    for source in body["sources"]:
        source["max_sample_length"] = 2048
    body["step"]["tokens_per_micro_batch"] = 512
    path = tmp_path / "long_context.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.kafka
def test_the_long_context_example_runs_end_to_end(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=12)
    spec = _spec(tmp_path, data, unique_name, kafka_bootstrap)
    state = tmp_path / "state"
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name]
    command += ["--state-dir", str(state), "--trainer", TRAINER]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((state / "jobs" / unique_name / "train" / "trainer-rank0.json").read_text())
    assert summary["exactly_once"] is True, summary["delivery"]
    assert summary["delivery"].startswith("every sample received exactly once, token for token: yes"), summary
    assert " on 4 ranks" in summary["delivery"] and summary["micro_batches_by_block"].get("4"), summary
    losses = summary["losses"]
    assert len(losses) >= 20 and losses[0] == pytest.approx(np.log(1024), abs=0.1), losses
    assert np.mean(losses[-5:]) < losses[0] - 0.5, f"the loss did not fall: {losses}"
    lines = run.stdout.splitlines()
    assert any(line.startswith("train: ") for line in lines), run.stdout  # the trainer's summary line
    assert "each sample exactly once: yes" in lines, run.stdout
    assert "context parallelism: aligned, blocks of up to 4 ranks" in lines, run.stdout
    check = "the trainer received every micro-batch exactly as written: "
    trained = [line.removeprefix(check) for line in lines if line.startswith(check)]
    assert len(trained) == 1 and trained[0].startswith("yes (") and "on 4 ranks, every step;" in trained[0], run.stdout
