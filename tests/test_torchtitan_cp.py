"""A static context-parallel job in torchtitan (``MixflowCPTrainer``, ``MixflowDataLoader``), each rank reading only
its own slices: the layout and mask of a rank's queries over its group's gathered keys; torchtitan's debug model
with FlexAttention over the slices of 2 gloo processes gives every token the loss the model gives it over the whole
micro-batch; what cannot train the slices is refused in one line; and torchtitan's own training loop under
torchrun trains the job, each rank on its topic, with the loss and gradients of the samples whole."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torchtitan")

from tests.integration_support import finish, start
from tests.ports import free_port
from tests.torchtitan_cp_support import (
    CAPACITY,
    CP,
    LOSS_CHUNKS,
    MOST_MICRO_BATCHES,
    STEPS,
    CPJob,
    cp_steps,
    logged_losses,
    write_cp_job,
)
from topics.formats.cp_slices import padded_length
from trainer_sink.cp_tensors import cp_micro_batch_tensors
from trainer_sink.integrations.torchtitan_cp import (
    IGNORE_INDEX,
    block_layout,
    block_mask_mod,
    cp_block_mask,
    titan_cp_batch,
)


def _zigzag(length: int, cp: int, rank: int) -> list[int]:
    """Rank ``rank``'s positions of a sample, as FORMAT.md words it: chunks ``rank`` and ``2cp - 1 - rank`` of
    ``2cp`` of the sample padded to a multiple of ``2cp``."""
    if cp == 1:
        return list(range(length))
    chunk = padded_length(length, cp) // (2 * cp)
    late = 2 * cp - 1 - rank
    return [*range(rank * chunk, (rank + 1) * chunk), *range(late * chunk, (late + 1) * chunk)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=6), st.integers(1, 4), st.integers(0, 9))
def test_the_block_layout_is_every_rank_s_slices_then_its_padding(lengths: list[int], cp: int, extra: int) -> None:
    held = sum(padded_length(n, cp) for n in lengths) // cp
    local = held + extra
    documents, positions = block_layout(np.array(lengths, np.int64), cp, local)
    assert documents.shape == positions.shape == (cp * local,)
    for rank in range(cp):
        part = slice(rank * local, (rank + 1) * local)
        want_documents = [j for j, n in enumerate(lengths) for _ in _zigzag(n, cp, rank)] + [-1] * extra
        want_positions = [p for n in lengths for p in _zigzag(n, cp, rank)] + list(range(extra))
        assert documents[part].tolist() == want_documents
        assert positions[part].tolist() == want_positions
        queries, keys = torch.meshgrid(torch.arange(local), torch.arange(cp * local), indexing="ij")
        docs, pos = torch.from_numpy(documents)[None], torch.from_numpy(positions)[None]
        mask = block_mask_mod(docs, pos, rank, cp)(0, 0, queries, keys)
        q_doc, q_pos = documents[part][:, None], positions[part][:, None]
        want = (q_doc == documents[None, :]) & (positions[None, :] <= q_pos)
        assert torch.equal(mask, torch.from_numpy(want))


@pytest.mark.parametrize(("lengths", "cp"), [([5, 30, 1], 2), ([61, 2], 3)])
def test_the_block_mask_is_the_rank_s_queries_over_the_gathered_keys(lengths: list[int], cp: int) -> None:
    """Its blocks are those holding a pair the mask mod allows, over ``T`` queries and ``C x T`` keys."""
    from torch.nn.attention.flex_attention import create_mask

    local = sum(padded_length(n, cp) for n in lengths) // cp + 3
    docs, pos = (torch.from_numpy(a)[None] for a in block_layout(np.array(lengths), cp, local))
    for rank in range(cp):
        block_mask = cp_block_mask(docs, pos, rank, cp, BLOCK_SIZE=16)
        assert block_mask.shape == (1, 1, local, cp * local)
        dense = create_mask(block_mask_mod(docs, pos, rank, cp), 1, None, local, cp * local, device="cpu")[0, 0]
        padded = torch.nn.functional.pad(dense, (0, -dense.shape[1] % 16, 0, -dense.shape[0] % 16))
        any_pair = padded.reshape(padded.shape[0] // 16, 16, -1, 16).any(dim=(1, 3))
        assert torch.equal(block_mask.to_dense()[0, 0].bool(), any_pair)


# -- every token's loss over slices is its loss over the micro-batch ---------------------------------------------


def _debug_model() -> torch.nn.Module:
    """torchtitan's Llama 3 debug model (FlexAttention), 2 layers, float32, the same weights in every process."""
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel").model
    config.layers = config.layers[:2]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def _eager_flex(monkeypatch: pytest.MonkeyPatch | None = None, *, dense: bool = False) -> None:
    """torchtitan's FlexAttention without compiling (CPU): the eager kernel, or ``dense`` (with a backward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common import attention

    from tests.cpu_stand_ins import dense_flex_attention

    kernel = staticmethod(dense_flex_attention if dense else flex_attention)
    if monkeypatch is None:
        attention.FlexAttention._compiled_flex_attn = kernel
        attention._compiled_create_block_mask = create_block_mask
    else:
        monkeypatch.setattr(attention.FlexAttention, "_compiled_flex_attn", kernel)
        monkeypatch.setattr(attention, "_compiled_create_block_mask", create_block_mask)


def _whole_batch(samples: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples whole, packed as torchtitan's own data: tokens, positions from 0 per sample, next-token labels."""
    tokens = np.concatenate(samples).astype(np.int64)
    positions = np.concatenate([np.arange(s.size) for s in samples])
    labels = np.concatenate([np.append(s[1:], IGNORE_INDEX) for s in samples]).astype(np.int64)
    return tuple(torch.from_numpy(a)[None] for a in (tokens, positions, labels))  # type: ignore[return-value]


def _token_losses(model: torch.nn.Module, tokens, positions, labels, masks) -> torch.Tensor:
    logits = model(tokens, positions=positions, attention_masks=masks)
    return torch.nn.functional.cross_entropy(logits[0], labels[0], ignore_index=IGNORE_INDEX, reduction="none")


def _rank_losses(rank: int, port: int, folder: str) -> None:
    """In each of ``CP`` processes: the model over the whole micro-batches (rank 0), then, context-parallel as
    torchtitan's ``apply_cp_to_forward`` makes it, over this rank's slices of them; the losses by (step,
    micro-batch, sample, position) to ``folder``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.context_parallel import apply_cp_to_forward

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=CP)
    try:
        _eager_flex()
        steps, whole = cp_steps()
        model = _debug_model().eval()
        rows: list[tuple[int, int, int, int, float]] = []
        with torch.no_grad():
            if rank == 0:
                for step, micro_batches in enumerate(whole):
                    for m, samples in enumerate(micro_batches):
                        tokens, positions, labels = _whole_batch(samples)
                        losses = _token_losses(model, tokens, positions, labels, model.get_attention_masks(positions))
                        documents = np.repeat(np.arange(len(samples)), [s.size for s in samples])
                        for d, p, y, loss in zip(documents, positions[0], labels[0], losses, strict=True):
                            if y != IGNORE_INDEX:
                                rows.append((step, m, int(d), int(p), float(loss)))
                np.save(Path(folder) / "whole.npy", np.array(rows))
            rows = []
            apply_cp_to_forward(
                [b.attention.inner_attention for b in model.layers.values()], init_device_mesh("cpu", (CP,))
            )
            for step, batches in enumerate(steps):
                for micro in cp_micro_batch_tensors(batches[rank]):
                    batch, labels = titan_cp_batch(micro, cp_rank=rank, cp_size=CP, pad_to_multiple_of=LOSS_CHUNKS)
                    documents, all_positions = batch["block_documents"], batch["block_positions"]
                    masks = cp_block_mask(documents, all_positions, rank, CP)
                    losses = _token_losses(model, batch["input"], batch["positions"], labels, masks)
                    local = labels.shape[1]
                    mine = documents[0, rank * local : (rank + 1) * local]
                    for d, p, y, loss in zip(mine, batch["positions"][0], labels[0], losses, strict=True):
                        if y != IGNORE_INDEX:
                            rows.append((step, micro["micro_batch"], int(d), int(p), float(loss)))
            np.save(Path(folder) / f"rank{rank}.npy", np.array(rows))
    finally:
        dist.destroy_process_group()


def test_every_token_s_loss_over_the_slices_is_its_loss_over_the_whole_micro_batch(tmp_path: Path) -> None:
    """Three steps of odd and even lengths (1 to 125 tokens, one sample filling the block, zigzag padding inside the
    slices and loader padding after them), each rank's micro-batches as the sink gives them."""
    import torch.multiprocessing as mp
    import torchtitan.distributed.context_parallel
    import torchtitan.models.llama3  # noqa: F401

    # fork: the processes take torchtitan as imported here (each one importing it again takes tens of seconds)
    mp.start_processes(_rank_losses, args=(free_port(), str(tmp_path)), nprocs=CP, join=True, start_method="fork")
    whole = {tuple(map(int, r[:4])): r[4] for r in np.load(tmp_path / "whole.npy")}
    sliced: dict[tuple[int, ...], float] = {}
    for rank in range(CP):
        for r in np.load(tmp_path / f"rank{rank}.npy"):
            key = tuple(map(int, r[:4]))
            assert key not in sliced, f"token {key} takes a loss on two ranks"
            sliced[key] = r[4]
    assert sorted(sliced) == sorted(whole), "every token but a sample's last takes a loss, on one rank"
    keys = sorted(whole)
    np.testing.assert_allclose([sliced[k] for k in keys], [whole[k] for k in keys], rtol=1e-5, atol=0)


# -- refusals --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job(kafka_bootstrap: str) -> CPJob:
    import uuid

    return write_cp_job(kafka_bootstrap, f"t{uuid.uuid4().hex[:8]}-titan-cp")


def _loader(job: str, bootstrap: str, *, dp: tuple[int, int] = (0, 1), cp: tuple[int, int] | None = (0, CP)):
    from trainer_sink.integrations.torchtitan_data import MixflowDataLoader

    config = MixflowDataLoader.Config(job=job, bootstrap_servers=bootstrap, pad_to_multiple_of=8, wait_timeout_s=60)
    loader = config.build(dp_rank=dp[0], dp_world_size=dp[1], local_batch_size=1, seq_len=CP * CAPACITY)
    if cp is not None:
        loader.set_context_parallel(*cp)
    return loader


@pytest.mark.kafka
def test_what_cannot_train_the_slices_is_refused_in_one_line(
    job: CPJob, kafka_bootstrap: str, unique_name: str
) -> None:
    from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
    from pipeline.planning.step.assemble_cp import build_cp_batches
    from pipeline.spec.cp_cost import ContextParallelCost
    from tests.sink_support import random_batch, write_steps
    from topics.errors import MixflowError
    from topics.formats.sample import Sample

    refusals = {
        "MixflowCPTrainer": _loader(job.name, kafka_bootstrap, cp=None),  # torchtitan's own Trainer
        r"context_parallel_degree=2": _loader(job.name, kafka_bootstrap, cp=(0, 1)),
        r"2 ranks of the data x context mesh .* 2 data-parallel x 2 context-parallel": _loader(
            job.name, kafka_bootstrap, dp=(0, 2), cp=(0, CP)
        ),
    }
    aligned = f"{unique_name}-aligned"
    samples = [Sample(f"s/{i}", "s", np.arange(n, dtype=np.int32)) for i, n in enumerate([90, 7, 30])]
    shape = CPShape(CP, 2, CAPACITY, CPMode.ALIGNED, CP)
    plan = plan_cp_step(np.array([s.length for s in samples]), shape, ContextParallelCost())
    write_steps(kafka_bootstrap, aligned, [build_cp_batches(0, plan, samples)])
    refusals["aligned context parallelism.*Megatron"] = _loader(aligned, kafka_bootstrap)
    plain = f"{unique_name}-plain"
    write_steps(kafka_bootstrap, plain, [[random_batch(np.random.default_rng(0), 0, 0, 1, 1, 32)]])
    refusals["not a context-parallel job's"] = _loader(plain, kafka_bootstrap, cp=(0, 1))
    for refusal, loader in refusals.items():
        with pytest.raises(MixflowError, match=refusal) as caught:
            next(iter(loader))
        assert "\n" not in str(caught.value)


def test_the_trainer_refuses_what_it_cannot_train_before_it_builds_anything() -> None:
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from topics.errors import MixflowError
    from trainer_sink.integrations.torchtitan_cp_trainer import MixflowCPTrainer
    from trainer_sink.integrations.torchtitan_data import MixflowDataLoader

    def config(**changes):
        config = MixflowCPTrainer.Config.of(llama3_debugmodel())
        config.dataloader = MixflowDataLoader.Config(job="any")
        config.parallelism.context_parallel_load_balancer = None
        for name, value in changes.items():
            setattr(config.parallelism if name.startswith("context") else config, name, value)
        return config

    with pytest.raises(MixflowError, match=r"context_parallel_load_balancer='headtail'.*set it to None"):
        MixflowCPTrainer(config(context_parallel_load_balancer="headtail"))
    with pytest.raises(MixflowError, match=r"FlexAttention.*not VarlenAttention\.Config"):
        MixflowCPTrainer(config(model_spec=model_registry("debugmodel", attn_backend="varlen")))
    with pytest.raises(MixflowError, match=r"set config\.dataloader to MixflowDataLoader\.Config"):
        MixflowCPTrainer(config(dataloader=llama3_debugmodel().dataloader))


# -- torchtitan's training loop ----------------------------------------------------------------------------------


def _expected_batches(job: CPJob, rank: int) -> list[dict]:
    """What rank ``rank`` trains each step: its slices of each micro-batch, padded to a multiple of 8 tokens, then
    one padding batch a micro-batch the step has fewer than ``MOST_MICRO_BATCHES``."""
    out = []
    for step, batches in enumerate(job.batches):
        batch = batches[rank]
        for m in range(MOST_MICRO_BATCHES):
            rows = np.flatnonzero(batch.micro_batch == m)
            pieces = [batch.records.column(k).to_pylist() for k in ("tokens", "positions")]
            tokens = [t for r in rows for t in pieces[0][r]]
            positions = [p for r in rows for p in pieces[1][r]]
            pad = -len(tokens) % LOSS_CHUNKS or (0 if tokens else LOSS_CHUNKS)
            out.append({"step": step + 1, "input": tokens + [0] * pad, "positions": positions + list(range(pad))})
    return out


def _reference(job: CPJob, weights: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """Training step 1 (the job's step 0) over the samples whole: the loss, divided by the step's loss tokens, and
    the gradients of the model with ``weights``."""
    model = _debug_model()
    model.load_state_dict(weights)
    total = torch.zeros(())
    loss_tokens = job.batches[0][0].loss_tokens
    for samples in job.micro_batches[0]:
        tokens, positions, labels = _whole_batch(samples)
        total = total + _token_losses(model, tokens, positions, labels, model.get_attention_masks(positions)).sum()
    loss = total / loss_tokens
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.kafka
def test_torchtitan_trains_the_job_each_rank_on_its_slices_with_the_whole_samples_gradients(
    job: CPJob, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Path(__file__).resolve().parent / "integration_torchtitan_cp_train.py"
    out = tmp_path / "run"
    try:
        finish(start(script, CP, out, "--job", job.name, "--bootstrap", job.bootstrap, "--out", str(out)), out)
    except AssertionError as exc:
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error-rank*.txt")))
        raise AssertionError(f"{exc}\nthe ranks' own errors:\n{errors}") from None
    for rank in range(CP):
        lines = (out / f"batches-rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == _expected_batches(job, rank), f"rank {rank}"
    losses = logged_losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in losses.values())

    _eager_flex(monkeypatch, dense=True)
    loss, grads = _reference(job, torch.load(out / "weights.pt"))
    assert losses[1] == pytest.approx(loss, rel=1e-5)
    trained = torch.load(out / "grads.pt")
    assert sorted(trained) == sorted(grads)
    for name, grad in grads.items():
        error = float((trained[name] - grad).norm() / grad.norm())
        assert error < 1e-5, f"{name}: the gradient differs from the whole samples' by {error:.1e} of its norm"
