"""The step time each trainer integration adds on its framework's CPU loop, against the same loop fed the same
tensors from memory.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/python -m benchmarks.integration_overhead_bench [--steps 60]

A job of ``--steps`` steps (1 rank x 2 micro-batches x ``--tokens`` tokens of random samples) is written to its
rank topic directly (``tests/sink_support.py``). Each framework trains a tiny model (the tests' tiny Llama for
the Hugging Face ``Trainer``, the tests' embedding-MLP model for Lightning) one process on CPU, twice:

- **memory**: the framework's loop over a list of the micro-batches, built before the clock starts, in the
  layout the integration hands over (``padding_free_batch`` for transformers, the sink's dicts for Lightning);
- **mixflow**: the integration (``MixflowTrainer``, ``MixflowDataModule``) reading the rank topic.

Step time: the median interval between consecutive optimizer steps (a callback's clock), the first 5 left out.
The difference is what the integration adds per step: the sink's hand-over and the adapter's conversion (the
topic is read ahead on the sink's thread). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from tests.integration_lightning_train import TinyLanguageModel
from tests.sink_support import random_batch, write_steps
from trainer_sink import KafkaBatchDataset
from trainer_sink.integrations.hf_trainer import MixflowTrainer, padding_free_batch
from trainer_sink.integrations.lightning_data import MixflowDataModule

MICRO_BATCHES, SKIPPED = 2, 5


def _median_step(stamps: list[float]) -> float:
    gaps = np.diff(stamps[SKIPPED:])
    return float(statistics.median(gaps)) if gaps.size else float("nan")


class _HfClock(TrainerCallback):
    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, *args, **kwargs) -> None:  # after each optimizer step
        self.stamps.append(time.perf_counter())


class _LightningClock(pl.Callback):
    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if batch["micro_batch"] == batch["micro_batches"] - 1:  # the step's optimizer step is done
            self.stamps.append(time.perf_counter())


class _MemoryTrainer(Trainer):
    def __init__(self, *args, batches: list[dict], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches = batches

    def get_train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, num_workers=0)


def _hf(job: str, bootstrap: str, steps: int, mixflow: bool, folder: Path) -> float:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50_000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(folder / f"hf-{mixflow}"), max_steps=steps, gradient_accumulation_steps=MICRO_BATCHES,
        save_strategy="no", report_to=[], use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True,
    )  # fmt: skip
    clock = _HfClock()
    sink = KafkaBatchDataset(job=job, bootstrap_servers=bootstrap)
    if mixflow:
        trainer = MixflowTrainer(model=LlamaForCausalLM(config), args=args, sink=sink, callbacks=[clock])
    else:
        batches = [padding_free_batch(m) for m in sink]
        for batch in batches:
            batch.pop("mixflow")
        trainer = _MemoryTrainer(model=LlamaForCausalLM(config), args=args, batches=batches, callbacks=[clock])
    trainer.train()
    return _median_step(clock.stamps)


class _MemoryData(pl.LightningDataModule):
    def __init__(self, batches: list[dict]) -> None:
        super().__init__()
        self.batches = batches

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, num_workers=0)


def _lightning(job: str, bootstrap: str, steps: int, mixflow: bool, folder: Path) -> float:
    pl.seed_everything(0, verbose=False)
    clock = _LightningClock()
    if mixflow:
        data = MixflowDataModule(job=job, bootstrap_servers=bootstrap)
    else:
        data = _MemoryData(list(KafkaBatchDataset(job=job, bootstrap_servers=bootstrap)))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=MICRO_BATCHES, callbacks=[clock],
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(folder),
    )  # fmt: skip
    model = TinyLanguageModel()
    model.net[0] = torch.nn.Embedding(50_000, 32)
    model.net[-1] = torch.nn.Linear(64, 50_000)
    trainer.fit(model, datamodule=data)
    return _median_step(clock.stamps)


def written_job(description: str, name: str) -> tuple[argparse.Namespace, str, str]:
    """The benchmark's arguments, and a job of random steps it wrote to the broker: ``(args, bootstrap, job)``."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per micro-batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    job = f"bench{uuid.uuid4().hex[:6]}-{name}"
    rng = np.random.default_rng(0)
    write_steps(bootstrap, job, [[random_batch(rng, k, 0, 1, MICRO_BATCHES, args.tokens)] for k in range(args.steps)])
    return args, bootstrap, job


def main() -> None:
    args, bootstrap, job = written_job(__doc__, "integration")
    arms: list[tuple[str, Callable]] = [("Hugging Face Trainer", _hf), ("Lightning", _lightning)]
    print(f"| framework | memory: ms/step | mixflow: ms/step | added ms/step | ({args.steps} steps, {args.tokens} tok)")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, run in arms:
            memory = run(job, bootstrap, args.steps, False, Path(folder))
            mixflow = run(job, bootstrap, args.steps, True, Path(folder))
            added = (mixflow - memory) * 1e3
            print(f"| {name} | {memory * 1e3:.2f} | {mixflow * 1e3:.2f} | {added:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
