"""mixflow in Lightning: ``MixflowDataModule``, a ``LightningDataModule`` over a job's rank topics.

    data = MixflowDataModule("job.yaml")
    trainer = L.Trainer(accumulate_grad_batches=M, max_steps=N, callbacks=[ModelCheckpoint(...)], ...)
    trainer.fit(model, datamodule=data, ckpt_path="last")   # "last": resume when there is a checkpoint

What it does for the user:

- **Batches**: the sink's micro-batches as they are (``trainer_sink.tensors``: packed ``input_ids``,
  ``labels``, ``position_ids``, ``cu_seqlens``, ``step``, ``sample_ids`` ...), one Lightning batch each;
  ``accumulate_grad_batches`` must be the job's ``step.micro_batches`` (checked on every batch) so that one
  optimizer step is one step of the job and ``max_steps`` counts the job's steps.
- **Ranks**: ``setup`` makes the sink of this process's data-parallel rank from Lightning's global rank and
  world size (with ``tensor_parallel`` and the other sizes given, the sink's rank layout); the data loader
  is ``DataLoader(..., batch_size=None)`` in the training process, and Lightning's distributed sampler
  does not apply to an iterable dataset.
- **Checkpoints**: ``state_dict()`` is the sink's position after the last batch *trained*, not the last one
  read: Lightning fetches a batch ahead of the one it trains, and a checkpoint holding the read position would
  skip it on resume. The module sees which batch trains in ``on_before_batch_transfer``, which Lightning calls
  at the start of each training batch (if the LightningModule overrides that hook, Lightning calls the
  module's instead: call ``self.trainer.datamodule.on_before_batch_transfer(batch, dataloader_idx)`` there).
- **Resume**: ``trainer.fit(..., ckpt_path=...)`` gives the module its state back (``load_state_dict``) and
  the sink goes on from there. Lightning writes rank 0's state: every rank resumes from it, each finding that
  step on its own topic by number (ranks train in lockstep), under the same or another number of ranks
  (after ``mixflow replay --ranks``, with the module reading the replayed job).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.tensors import MicroBatch

STATE_VERSION = 1


class _PositionedBatches(IterableDataset):
    """The sink's micro-batches; the sink's position after each is noted for the module, by (step, micro-batch)."""

    def __init__(self, module: MixflowDataModule) -> None:
        super().__init__()
        self.module = module

    def __iter__(self) -> Iterator[MicroBatch]:
        sink = self.module.sink
        batches = self.module._batches = iter(sink)
        try:
            for micro_batch in batches:
                self.module._read[(micro_batch["step"], micro_batch["micro_batch"])] = sink.state_dict()
                yield micro_batch
        finally:
            batches.close()


class MixflowDataModule(pl.LightningDataModule):
    """A job's micro-batches for ``trainer.fit`` (see the module's docstring). ``spec`` or ``job=`` (with
    ``bootstrap_servers=`` or ``kafka_config=``) name the job; other keyword arguments go to
    ``KafkaBatchDataset`` (``layout``, ``pad_to_multiple_of``, ``tensor_parallel`` ...)."""

    def __init__(self, spec: str | os.PathLike[str] | None = None, **sink_options: Any) -> None:
        super().__init__()
        for taken in ("rank", "global_rank", "world_size"):
            if taken in sink_options:
                msg = f"MixflowDataModule takes the rank from the Lightning trainer: do not give {taken}="
                raise MixflowError(msg)
        self.spec = spec
        self.sink_options = sink_options
        self.sink: KafkaBatchDataset | None = None
        self._batches: Any = None  # the sink's iterator while one is open: teardown closes it
        self._trained: dict[str, Any] | None = None  # the sink's position after the last batch trained
        self._read: dict[tuple[int, int], dict[str, Any]] = {}

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.sink is None:
            self.sink = KafkaBatchDataset(
                self.spec,
                global_rank=self.trainer.global_rank,
                world_size=self.trainer.world_size,
                **self.sink_options,
            )
            if self._trained is not None:
                self.sink.load_state_dict(self._trained)

    def train_dataloader(self) -> DataLoader:
        if self.sink is None:
            msg = "MixflowDataModule.train_dataloader before setup('fit')"
            raise MixflowError(msg)
        self._read.clear()
        return DataLoader(_PositionedBatches(self), batch_size=None, num_workers=0)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is None or not trainer.training or not isinstance(batch, Mapping) or "micro_batches" not in batch:
            return batch
        if batch["micro_batches"] != trainer.accumulate_grad_batches:
            msg = (
                f"step {batch['step']} has {batch['micro_batches']} micro-batches, but accumulate_grad_batches is "
                f"{trainer.accumulate_grad_batches}: set it to the job's step.micro_batches so that one optimizer "
                "step is one step of the job"
            )
            raise MixflowError(msg)
        key = (batch["step"], batch["micro_batch"])
        if key in self._read:
            self._trained = self._read.pop(key)
            for older in [k for k in self._read if k < key]:
                del self._read[older]
        return batch

    def teardown(self, stage: str) -> None:
        """Stop the sink's reader thread and consumer before the process ends: Lightning stops at
        ``max_steps`` with the loader's iterator still open."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    def state_dict(self) -> dict[str, Any]:
        if self._trained is None:
            return {}
        return {"version": STATE_VERSION, "sink": dict(self._trained)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict.get("version") != STATE_VERSION or "sink" not in state_dict:
            msg = f"not a MixflowDataModule state of version {STATE_VERSION}: {sorted(state_dict)}"
            raise MixflowError(msg)
        self._trained = dict(state_dict["sink"])
        if self.sink is not None:
            self.sink.load_state_dict(self._trained)
