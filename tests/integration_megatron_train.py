"""A tiny Megatron-Core GPT (local layer spec, rotary positions) trained by Megatron-Core's own schedule
(``get_forward_backward_func``, its micro-batches per iteration over ``MixflowDataIterator``) under torchrun,
one process per data-parallel rank (``parallel_state``; DDP on gloo, CPU): the script
tests/test_integration_megatron.py runs, kills and resumes.

Checkpoints are Megatron-LM's layout in ``OUT/checkpoints``: ``iter_<7 digits>/`` with the model and optimizer
(``mp_rank_00/model_optim_rng.pt``) and the sink state the iterator writes there, and the tracker file
``latest_checkpointed_iteration.txt`` written last; a run resumes from the tracker's iteration, if any.
(Megatron-Core's ``dist_checkpointing`` did not finish a save on CPU over gloo, so the model goes in one file.)

Megatron-Core assumes CUDA: ``tests.cpu_stand_ins.megatron_on_cpu`` and ``CpuForCuda`` stand in for it.
Transformer Engine is not installed, so the attention is the local ``DotProductAttention``, which has no THD
support: the samples are kept apart by the iterator's dense block-causal ``attention_mask``.

Each rank appends one line per micro-batch trained to ``OUT/received-rank<r>.jsonl`` (written whole after each
iteration, before its checkpoint) and its pid to ``OUT/pid-rank<r>``."""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.cpu_stand_ins import CpuForCuda, megatron_on_cpu

megatron_on_cpu()

# Imported after the stand-ins are in place: Megatron-Core binds the device at import.
from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from tests.integration_support import CAPACITY, MICRO_BATCHES, SAVE_EVERY, STEPS, record_line  # noqa: E402
from trainer_sink.integrations.megatron_data import (  # noqa: E402
    TRACKER_FILE,
    MixflowDataIterator,
    get_batch,
    iteration_folder,
    latest_iteration,
)

PAD_TO = 8


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``pretrain_gpt.py``'s: the per-token losses summed under the mask, and the tokens counted."""
    loss = torch.sum(output_tensor.view(-1).float() * loss_mask.view(-1))
    tokens = loss_mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.float()])}


def forward_step(data: MixflowDataIterator, pending: list[str], data_iterator: Any, model: torch.nn.Module):
    tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params = get_batch(data_iterator)
    meta = data.micro_batch_info
    ids = tokens[0]
    trained = ids[: ids.numel() - meta["padding_tokens"]] if meta["sample_ids"] else ids[:0]
    pending.append(record_line(meta["step"], meta["micro_batch"], list(meta["sample_ids"]), trained.numpy()))
    output = model(
        tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask, packed_seq_params=packed_seq_params
    )
    return output, partial(loss_func, loss_mask)


def build_model(vocab_size: int = 256, max_sequence_length: int = CAPACITY + PAD_TO) -> GPTModel:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        calculate_per_token_loss=True,  # an empty micro-batch has no token to divide by
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab_size,
        max_sequence_length=max_sequence_length,
        position_embedding_type="rope",
    )


def save_model(root: Path, iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Rank 0 writes the model and optimizer, then (every rank's sink state written) the tracker file."""
    if dist.get_rank() == 0:
        path = iteration_folder(root, iteration) / "mp_rank_00" / "model_optim_rng.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}, path)
    dist.barrier()
    if dist.get_rank() == 0:
        temporary = root / f".{TRACKER_FILE}.tmp"
        temporary.write_text(f"{iteration}\n")
        os.replace(temporary, root / TRACKER_FILE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pid-rank{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    gpt = build_model()
    model = DistributedDataParallel(gpt)
    gpt.config.no_sync_func = model.no_sync  # gradients all-reduced at the step's last micro-batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    root = args.out / "checkpoints"
    data = MixflowDataIterator(
        job=args.job,
        bootstrap_servers=args.bootstrap,
        num_microbatches=MICRO_BATCHES,
        pad_to_multiple_of=PAD_TO,
        attention_mask=True,
        save=root,
        save_interval=SAVE_EVERY,
        train_iters=STEPS,
        wait_timeout_s=60,
    )
    iteration = latest_iteration(root) or 0
    if iteration:
        saved = torch.load(iteration_folder(root, iteration) / "mp_rank_00" / "model_optim_rng.pt")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data.load_checkpoint(root, iteration)
    log_fd = os.open(
        args.out / f"received-rank{data.ranks.data_parallel_rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND
    )
    forward_backward = get_forward_backward_func()
    pending: list[str] = []
    while iteration < STEPS:
        optimizer.zero_grad()
        with CpuForCuda():
            forward_backward(
                forward_step_func=partial(forward_step, data, pending),
                data_iterator=data,
                model=[model],
                num_microbatches=MICRO_BATCHES,
                seq_length=CAPACITY,
                micro_batch_size=1,
            )
        optimizer.step()
        iteration += 1
        os.write(log_fd, "".join(line + "\n" for line in pending).encode())
        pending.clear()
        if iteration % SAVE_EVERY == 0:
            save_model(root, iteration, model, optimizer)
    data.close()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
