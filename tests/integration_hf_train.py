"""A tiny Llama trained with ``MixflowTrainer`` on a job's rank topics, one process per data-parallel rank
under torchrun (gloo on CPU): the script that tests/test_integration_hf.py runs, kills and resumes.

Each rank appends one line per micro-batch trained to ``OUT/received-rank<r>.jsonl`` (written whole at each
optimizer step) and its pid to ``OUT/pid-rank<r>``; checkpoints go to ``OUT/checkpoints``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, record_line
from trainer_sink import KafkaBatchDataset, ReadOptions
from trainer_sink.integrations.hf_trainer import MixflowTrainer, last_complete_checkpoint


class LoggingTrainer(MixflowTrainer):
    """Notes each micro-batch it trains: its place, sample ids and tokens (without the sink's padding)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: list[str] = []

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        meta = self.current_micro_batch
        ids = inputs["input_ids"][0]
        tokens = ids[: ids.numel() - meta["padding_tokens"]] if meta["sample_ids"] else ids[:0]
        self.pending.append(record_line(meta["step"], meta["micro_batch"], list(meta["sample_ids"]), tokens.numpy()))
        return loss


class ReceivedLog(TrainerCallback):
    """Writes the step's lines in one ``write`` once its optimizer step is done (before it is checkpointed)."""

    def __init__(self, trainer: LoggingTrainer, path: Path) -> None:
        self.trainer = trainer
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        os.write(self.fd, "".join(line + "\n" for line in self.trainer.pending).encode())
        self.trainer.pending.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--resume", action="store_true", help="from the last whole checkpoint in OUT, if any")
    parser.add_argument("--resume-from", help="this checkpoint folder")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pid-rank{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    training = TrainingArguments(
        output_dir=str(args.out / "checkpoints"),
        max_steps=STEPS,
        gradient_accumulation_steps=MICRO_BATCHES,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=SAVE_EVERY,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=0,
    )
    sink = KafkaBatchDataset(job=args.job, bootstrap_servers=args.bootstrap, read=ReadOptions(wait_timeout_s=60))
    trainer = LoggingTrainer(model=model, args=training, sink=sink)
    trainer.add_callback(ReceivedLog(trainer, args.out / f"received-rank{sink.rank}.jsonl"))
    resume = args.resume_from or (args.resume and last_complete_checkpoint(training.output_dir) is not None)
    trainer.train(resume_from_checkpoint=resume or None)
    if torch.distributed.is_initialized():  # gloo's threads left at exit can abort the process (SIGABRT)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
