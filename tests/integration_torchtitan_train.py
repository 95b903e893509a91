"""A small torchtitan Llama 3 trained by torchtitan's own ``Trainer`` (its loop, batch handling, FSDP over the
data-parallel ranks and ``CheckpointManager``) on a job's rank topics through ``MixflowDataLoader``, one
process per data-parallel rank under torchrun (gloo on CPU): the script tests/test_integration_torchtitan.py
runs, kills and resumes. The trainer resumes from the last whole checkpoint in ``OUT/checkpoints``, if any.

torchtitan 0.3 assumes an accelerator: ``tests.cpu_stand_ins.torchtitan_on_cpu`` stands in for it.

Each rank appends one line per micro-batch trained to ``OUT/received-rank<r>.jsonl`` (written whole after
each training step, before its checkpoint) and its pid to ``OUT/pid-rank<r>``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from tests.cpu_stand_ins import torchtitan_on_cpu

torchtitan_on_cpu()

# Imported after the stand-ins are in place: torchtitan's modules bind the device at import.
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from tests.integration_support import CAPACITY, MICRO_BATCHES, SAVE_EVERY, STEPS, record_line  # noqa: E402
from trainer_sink.integrations.torchtitan_data import MixflowDataLoader, NoTokenizer  # noqa: E402

LOSS_CHUNKS = 8  # ChunkedLossWrapper's default num_chunks: every micro-batch's length must be a multiple


class LoggingTrainer(Trainer):
    """Notes each micro-batch it trains: its place and sample ids (from the loader) and the tokens the model
    got (without the loader's padding), written once the step is trained."""

    def __init__(self, config: Trainer.Config, out: Path) -> None:
        self.inputs: list[torch.Tensor] = []
        self.out = out
        super().__init__(config)
        self.log_fd = os.open(
            out / f"received-rank{self.dataloader.dp_rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )

    def post_dataloading_process(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor):
        self.inputs.append(input_dict["input"][0].detach().cpu())
        return super().post_dataloading_process(input_dict, labels)

    def train_step(self, data_iterator: Any) -> None:
        super().train_step(data_iterator)
        lines = []
        for meta, ids in zip(self.dataloader.step_micro_batches, self.inputs, strict=True):
            tokens = ids[: ids.numel() - meta["padding_tokens"]] if meta["sample_ids"] else ids[:0]
            lines.append(record_line(meta["step"], meta["micro_batch"], list(meta["sample_ids"]), tokens.numpy()))
        self.inputs.clear()
        os.write(self.log_fd, "".join(line + "\n" for line in lines).encode())


def config_for(job: str, bootstrap: str, out: Path, ranks: int) -> Trainer.Config:
    config = llama3_debugmodel()
    model = config.model_spec.model
    model.layers = model.layers[:2]
    config.tokenizer = NoTokenizer.Config(vocab_size=256)
    config.dataloader = MixflowDataLoader.Config(
        job=job, bootstrap_servers=bootstrap, pad_to_multiple_of=LOSS_CHUNKS, wait_timeout_s=60
    )
    # Replicated (DDP): FSDP's reduce-scatter uses PREMUL_SUM, which gloo does not have.
    config.parallelism.data_parallel_replicate_degree = ranks
    config.parallelism.data_parallel_shard_degree = 1
    config.training.local_batch_size = 1
    config.training.global_batch_size = ranks * MICRO_BATCHES
    config.training.seq_len = CAPACITY
    config.training.steps = STEPS
    config.training.disable_cuda_graphs = True
    config.validator.enable = False
    config.dump_folder = str(out)
    config.checkpoint.enable = True
    config.checkpoint.folder = "checkpoints"
    config.checkpoint.interval = SAVE_EVERY
    config.checkpoint.keep_latest_k = 0
    config.checkpoint.last_save_model_only = False
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pid-rank{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = LoggingTrainer(config_for(args.job, args.bootstrap, args.out, ranks), args.out)
    try:
        trainer.train()
    finally:
        trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
