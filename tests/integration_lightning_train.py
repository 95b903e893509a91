"""A tiny language model trained by Lightning's ``Trainer`` from ``MixflowDataModule``, one process per
data-parallel rank under torchrun (DDP on gloo, CPU): the script that tests/test_integration_lightning.py runs,
kills and resumes.

Each rank appends one line per micro-batch trained to ``OUT/received-rank<r>.jsonl`` (written whole at each
optimizer step, before the step's checkpoint) and its pid to ``OUT/pid-rank<r>``; checkpoints go to
``OUT/checkpoints`` (``last.ckpt`` and one per checkpointed step)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional

from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, record_line
from trainer_sink import ReadOptions
from trainer_sink.integrations.lightning_data import MixflowDataModule


class TinyLanguageModel(pl.LightningModule):
    """Embedding, one MLP block, a head: each token predicts the next one (the sink's ``labels``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 256))
        self.pending: list[str] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self.net(batch["input_ids"].long())
        labels = batch["labels"]
        loss = functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        tokens = batch["input_ids"][: batch["input_ids"].numel() - batch["padding_tokens"]]
        self.pending.append(record_line(batch["step"], batch["micro_batch"], list(batch["sample_ids"]), tokens))
        return loss / max(int((labels != -100).sum()), 1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class ReceivedLog(pl.Callback):
    """Writes a step's lines in one ``write`` after its optimizer step (callbacks run before ModelCheckpoint)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, i: int):
        if batch["micro_batch"] == batch["micro_batches"] - 1:
            os.write(self.fd, "".join(line + "\n" for line in module.pending).encode())
            module.pending.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--ckpt-path", help="a checkpoint, or 'last'")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pid-rank{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    data = MixflowDataModule(job=args.job, bootstrap_servers=args.bootstrap, read=ReadOptions(wait_timeout_s=60))
    checkpoints = ModelCheckpoint(
        dirpath=args.out / "checkpoints", every_n_train_steps=SAVE_EVERY, save_top_k=-1, save_last=True
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=processes,
        strategy="ddp" if processes > 1 else "auto",
        max_steps=STEPS,
        accumulate_grad_batches=MICRO_BATCHES,
        callbacks=[ReceivedLog(args.out / f"received-rank{rank}.jsonl"), checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(TinyLanguageModel(), datamodule=data, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
