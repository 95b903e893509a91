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
  does not apply to an iterable dataset. The job must have as many ranks as that data-parallel size (checked
  on every micro-batch: fewer processes would train only their share of each step).
- **Checkpoints**: ``state_dict()`` is the sink's position at the start of the step that the model's weights
  have not taken yet: after the last micro-batch *trained* when it ended a step, else at the start of its
  step. Lightning fetches a batch ahead of the one it trains, so the read position would skip that batch; and
  ``ModelCheckpoint`` also saves in the middle of a step (after a resume, it saves again at the resumed step,
  after its first micro-batch), when the gradients of the step's first micro-batches are in no checkpoint, so
  the step must be trained again whole. The module sees which batch trains in ``on_before_batch_transfer``,
  which Lightning calls at the start of each training batch (if the LightningModule overrides that hook,
  Lightning calls the module's instead: call ``self.trainer.datamodule.on_before_batch_transfer(batch,
  dataloader_idx)`` there).
- **Resume**: ``trainer.fit(..., ckpt_path=...)`` gives the module its state back (``load_state_dict``) and
  the sink goes on from there. From a checkpoint taken in the middle of a step, Lightning would go on with the
  step's later micro-batches and step the optimizer on their gradients alone: the module rewinds Lightning's
  count of the epoch's batches to the start of the step (``fit_loop.epoch_loop.batch_progress``), so that the
  step is trained whole and its optimizer step comes after its last micro-batch. A checkpoint without this
  module's state is refused (Lightning keeps a data module's state under its class name: a checkpoint written
  with another class, a subclass included, has none), as resuming from it would train the job from its start
  again. Lightning writes rank 0's state: every rank resumes from it, each finding that step on its own topic
  by number (ranks train in lockstep), under the same or another number of ranks (after ``mixflow replay
  --ranks``, with the module reading the replayed job).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.integrations.job_shape import require_data_parallel_size
from trainer_sink.tensors import MicroBatch

log = logging.getLogger(__name__)

STATE_VERSION = 1


class _PositionedBatches(IterableDataset):
    """The sink's micro-batches. For each, by (step, micro-batch), the module notes the sink's position to
    checkpoint once it is trained: after it when it ends its step, else at the start of its step."""

    def __init__(self, module: MixflowDataModule, sink: KafkaBatchDataset, data_parallel_size: int) -> None:
        super().__init__()
        self.module = module
        self.sink = sink
        self.data_parallel_size = data_parallel_size

    def __iter__(self) -> Iterator[MicroBatch]:
        sink = self.sink
        step_start = sink.state_dict()
        batches = self.module._batches = iter(sink)
        try:
            for micro_batch in batches:
                require_data_parallel_size(sink, self.data_parallel_size, "Lightning's data-parallel size")
                if micro_batch["micro_batch"] == micro_batch["micro_batches"] - 1:
                    step_start = sink.state_dict()
                self.module._read[(micro_batch["step"], micro_batch["micro_batch"])] = step_start
                yield micro_batch
        finally:
            batches.close()


class MixflowDataModule(pl.LightningDataModule):
    """A job's micro-batches for ``trainer.fit`` (see the module's docstring). ``spec`` or ``job=`` (with
    ``bootstrap_servers=`` or ``kafka_config=``) name the job, or both (the spec's settings for that job);
    other keyword arguments go to ``KafkaBatchDataset`` (``read=ReadOptions(...)``, ``tensor_parallel`` ...)."""

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
        self._trained: dict[str, Any] | None = None  # the position to checkpoint: see _PositionedBatches
        self._read: dict[tuple[int, int], dict[str, Any]] = {}
        self._loaded = False  # whether a checkpoint gave this module its state
        self._aligned = False  # whether Lightning's accumulation was checked against the stream's steps

    @property
    def _fitting(self) -> pl.Trainer:
        """The trainer this module is attached to."""
        if self.trainer is None:
            msg = "MixflowDataModule is not attached to a Lightning Trainer: give it to trainer.fit(datamodule=...)"
            raise MixflowError(msg)
        return self.trainer

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.sink is None:
            self.sink = KafkaBatchDataset(
                self.spec,
                global_rank=self._fitting.global_rank,
                world_size=self._fitting.world_size,
                **self.sink_options,
            )
            if self._trained is not None:
                self.sink.load_state_dict(self._trained)

    def train_dataloader(self) -> DataLoader:
        if self.sink is None:
            msg = "MixflowDataModule.train_dataloader before setup('fit')"
            raise MixflowError(msg)
        checkpoint = self._fitting.ckpt_path
        if checkpoint is not None and not self._loaded:
            msg = (
                f"checkpoint {checkpoint} holds no state of this data module (Lightning keeps it under the class "
                f"name, {type(self).__qualname__!r}, and finds none): resuming from it would train the job's steps "
                "from the start again; resume from a checkpoint written with this data module's class"
            )
            raise MixflowError(msg)
        if self._trained is None:
            self._trained = self.sink.state_dict()
        self._read.clear()
        self._aligned = False
        data_parallel_size = self.sink.data_parallel_size or self._fitting.world_size
        return DataLoader(_PositionedBatches(self, self.sink, data_parallel_size), batch_size=None, num_workers=0)

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
        self._align_accumulation(trainer, batch)
        key = (batch["step"], batch["micro_batch"])
        if key in self._read:
            self._trained = self._read.pop(key)
            for older in [k for k in self._read if k < key]:
                del self._read[older]
        return batch

    def _align_accumulation(self, trainer: pl.Trainer, batch: Mapping[str, Any]) -> None:
        """Lightning steps the optimizer after every ``accumulate_grad_batches`` batches of its epoch: the batch
        about to train must be at the same place in Lightning's accumulation as in the job's step. Resumed from
        a checkpoint taken in the middle of a step, Lightning counts the step's trained micro-batches, whose
        gradients the checkpoint does not hold, while the stream goes on at the step's start: the count goes
        back to the step's start, once, at the first batch."""
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        place = progress.ready % trainer.accumulate_grad_batches
        if place == batch["micro_batch"]:
            self._aligned = True
            return
        if not self._aligned and batch["micro_batch"] == 0:
            for counter in ("ready", "started", "processed", "completed"):
                setattr(progress, counter, getattr(progress, counter) - place)
            log.info(
                "resumed from a checkpoint taken after micro-batch %d of step %d: the step is trained again whole",
                place - 1,
                batch["step"],
            )
            self._aligned = True
            return
        msg = (
            f"Lightning is at batch {place} of {trainer.accumulate_grad_batches} of its gradient accumulation, but "
            f"the batch is micro-batch {batch['micro_batch']} of step {batch['step']}: its optimizer steps would "
            "not fall between the job's steps"
        )
        raise MixflowError(msg)

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
        self._loaded = True
        if self.sink is not None:
            self.sink.load_state_dict(self._trained)
