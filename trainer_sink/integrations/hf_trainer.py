"""mixflow in the Hugging Face ``Trainer`` (transformers, accelerate underneath): ``MixflowTrainer``.

    trainer = MixflowTrainer(model=model, args=TrainingArguments(..., max_steps=N, gradient_accumulation_steps=M),
                             sink=KafkaBatchDataset("job.yaml"))
    trainer.train(resume_from_checkpoint=True)   # True: the last whole checkpoint in output_dir, if any

What it does for the user:

- **Batches**: each micro-batch of the job is one ``Trainer`` batch in transformers' padding-free layout, as
  ``DataCollatorWithFlattening`` makes it: ``input_ids``, ``labels`` and ``position_ids`` of shape
  ``[1, T]`` (int64), the samples concatenated, ``position_ids`` restarting at 0 at each sample (from which
  transformers' attention, SDPA and eager included, keeps samples apart), ``labels`` the input ids with
  ``-100`` at each sample's first token and at tokens that are not targets of the loss (a conversation's user
  turns and role prefixes, as transformers' chat-template training masks them; the model shifts them). With
  ``flash_attn_kwargs`` also ``cu_seq_lens_q/k`` and ``max_length_q/k``. An empty micro-batch becomes one
  padding token without a label.
  ``inputs["mixflow"]`` holds the micro-batch's ``step``, ``micro_batch``, ``sample_ids`` and
  ``padding_tokens``; ``training_step`` takes it out before the model sees the batch and keeps it as
  ``trainer.current_micro_batch``.
- **Steps**: one optimizer step per step of the job: ``gradient_accumulation_steps`` must be the job's
  ``step.micro_batches`` (checked on every micro-batch), and ``max_steps`` counts the job's steps.
- **Ranks**: each process reads its own rank topic (the sink's rank); the data loader is not given to
  accelerate's ``prepare``, which would re-shard an ``IterableDataset`` (``IterableDatasetShard``) or read it on
  rank 0 and dispatch it; ``dispatch_batches`` and ``split_batches`` are set to ``False`` as well. The job must
  have as many ranks as the run has data-parallel ranks (the sink's ``data_parallel_size``, or the Trainer's
  world size when the sink was given its rank): checked on every micro-batch, as a run on fewer would train
  only their share of each step.
- **Checkpoints**: every checkpoint folder gets each rank's ``sink.state_dict()`` (``mixflow-sink-rank<r>.json``),
  written before transformers' own files and before ``trainer_state.json``, which transformers writes last.
- **Resume**: ``train(resume_from_checkpoint=...)`` loads the sink state of that checkpoint and sets
  ``ignore_data_skip=True`` (transformers would otherwise skip as many batches again as were trained). With
  ``True`` it takes the last checkpoint that has ``trainer_state.json``, not a folder a kill left half
  written. A checkpoint without sink state is refused. Under another number of ranks (after ``mixflow replay
  --ranks``, the sink reading the replayed job) each rank resumes from the saved state of its rank or of rank 0,
  found by step on its own topic.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import AcceleratorConfig
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.integrations.job_shape import require_data_parallel_size
from trainer_sink.integrations.sink_checkpoint import read_sink_state, write_sink_state
from trainer_sink.tensors import MicroBatch

log = logging.getLogger(__name__)

METADATA_KEY = "mixflow"
TRAINER_STATE_FILE = "trainer_state.json"


def padding_free_batch(micro_batch: MicroBatch, *, pad_token_id: int = 0, flash_attn_kwargs: bool = False) -> dict:
    """One packed micro-batch of the sink as transformers' ``DataCollatorWithFlattening`` lays it out."""
    input_ids = micro_batch["input_ids"].to(torch.int64)
    position_ids = micro_batch["position_ids"].to(torch.int64)
    cu_seqlens = micro_batch["cu_seqlens"].to(torch.int32)
    # The sink's labels are the next tokens (-100 where not a target); transformers' models shift them themselves.
    labels = torch.full_like(input_ids, -100)
    labels[1:] = micro_batch["labels"][:-1]
    if input_ids.numel() == 0:
        input_ids = torch.tensor([pad_token_id], dtype=torch.int64)
        position_ids = torch.zeros(1, dtype=torch.int64)
        labels = torch.tensor([-100], dtype=torch.int64)
        cu_seqlens = torch.tensor([0, 1], dtype=torch.int32)
    batch: dict[str, Any] = {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": position_ids.unsqueeze(0),
    }
    if flash_attn_kwargs:
        longest = int(cu_seqlens.diff().max())
        batch.update(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=longest, max_length_k=longest)
    batch[METADATA_KEY] = {
        key: micro_batch[key] for key in ("step", "micro_batch", "micro_batches", "sample_ids", "padding_tokens")
    }
    return batch


class PaddingFreeBatches(IterableDataset):
    """The sink's micro-batches as ``padding_free_batch``es; each micro-batch must belong to a step of
    ``micro_batches`` micro-batches (the trainer's gradient accumulation) over ``ranks`` data-parallel ranks."""

    def __init__(
        self, sink: KafkaBatchDataset, micro_batches: int, ranks: int, pad_token_id: int, flash_attn_kwargs: bool
    ) -> None:
        super().__init__()
        self.sink = sink
        self.micro_batches = micro_batches
        self.ranks = ranks
        self.pad_token_id = pad_token_id
        self.flash_attn_kwargs = flash_attn_kwargs
        self._batches: Any = None  # the sink's iterator while one is open: close() ends it

    def __iter__(self) -> Iterator[dict]:
        batches = self._batches = iter(self.sink)
        try:
            yield from self._padding_free(batches)
        finally:
            batches.close()

    def close(self) -> None:
        """Stop the sink's reader thread and consumer: the Trainer stops at ``max_steps`` with this iterator
        still open, and a reader thread alive when the process exits aborts it."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    def _padding_free(self, batches: Iterator[MicroBatch]) -> Iterator[dict]:
        for micro_batch in batches:
            require_data_parallel_size(self.sink, self.ranks, "the Trainer's data-parallel size")
            if micro_batch["micro_batches"] != self.micro_batches:
                msg = (
                    f"step {micro_batch['step']} of {self.sink.topic} has {micro_batch['micro_batches']} "
                    f"micro-batches, but gradient_accumulation_steps is {self.micro_batches}: set it to the job's "
                    "step.micro_batches so that one optimizer step is one step of the job"
                )
                raise MixflowError(msg)
            yield padding_free_batch(
                micro_batch, pad_token_id=self.pad_token_id, flash_attn_kwargs=self.flash_attn_kwargs
            )


def last_complete_checkpoint(output_dir: str | os.PathLike[str] | None) -> str | None:
    """The ``checkpoint-<step>`` folder of ``output_dir`` with the highest step that transformers finished
    writing (its ``trainer_state.json`` is written last), or ``None`` (as without ``output_dir``)."""
    if output_dir is None:
        return None
    root = Path(output_dir)
    if not root.is_dir():
        return None
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    steps = [
        int(entry.name.removeprefix(prefix))
        for entry in root.iterdir()
        if entry.name.startswith(prefix)
        and entry.name.removeprefix(prefix).isdigit()
        and (entry / TRAINER_STATE_FILE).is_file()
    ]
    return str(root / f"{prefix}{max(steps)}") if steps else None


class MixflowTrainer(Trainer):
    """A ``Trainer`` that trains on a mixflow job's rank topic through ``sink`` (see the module's docstring).

    ``args`` is changed in place: ``ignore_data_skip=True``, and accelerate's ``dispatch_batches`` and
    ``split_batches`` ``False``. ``train_dataset`` is the sink; ``max_steps`` must be set."""

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        *,
        sink: KafkaBatchDataset,
        pad_token_id: int = 0,
        flash_attn_kwargs: bool = False,
        **kwargs: Any,
    ) -> None:
        if "train_dataset" in kwargs:
            msg = "MixflowTrainer trains on its sink: give sink=, not train_dataset="
            raise MixflowError(msg)
        if args is None:
            msg = "MixflowTrainer needs TrainingArguments with max_steps (the job's steps to train)"
            raise MixflowError(msg)
        _configure(args)
        self.sink = sink
        self.current_micro_batch: dict[str, Any] | None = None
        self._train_batches: PaddingFreeBatches | None = None
        self._pad_token_id = pad_token_id
        self._flash_attn_kwargs = flash_attn_kwargs
        super().__init__(model=model, args=args, train_dataset=sink, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        ranks = self.sink.data_parallel_size or self.args.world_size
        batches = self._train_batches = PaddingFreeBatches(
            self.sink, self.args.gradient_accumulation_steps, ranks, self._pad_token_id, self._flash_attn_kwargs
        )
        # Not through accelerator.prepare: each process reads its own rank topic already.
        pin = bool(self.args.dataloader_pin_memory and torch.cuda.is_available())
        return DataLoader(batches, batch_size=None, num_workers=0, pin_memory=pin)

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        inputs = dict(inputs)
        self.current_micro_batch = inputs.pop(METADATA_KEY, None)
        return super().training_step(model, inputs, num_items_in_batch)

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        write_sink_state(folder, self.sink.rank, self.args.world_size, self.sink.state_dict())
        self.accelerator.wait_for_everyone()  # every rank's sink state is in place before trainer_state.json
        super()._save_checkpoint(model, trial)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; a checkpoint to resume from also gives the sink its position."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                msg = f"No valid checkpoint found in output directory ({self.args.output_dir})"
                raise ValueError(msg)
        if resume_from_checkpoint:
            self.sink.load_state_dict(read_sink_state(resume_from_checkpoint, self.sink.rank))
            log.info("resuming %s from %s at %s", self.sink.topic, resume_from_checkpoint, self.sink.state_dict())
        try:
            return super().train(resume_from_checkpoint or None, *args, **kwargs)
        finally:
            if self._train_batches is not None:
                self._train_batches.close()


def _configure(args: TrainingArguments) -> None:
    """The settings under which the Trainer neither skips, re-shards nor dispatches the sink's batches."""
    if not args.ignore_data_skip:
        log.info("MixflowTrainer sets ignore_data_skip=True: the sink resumes at its checkpointed position")
        args.ignore_data_skip = True
    accelerator = cast(AcceleratorConfig, args.accelerator_config)  # made one by TrainingArguments
    accelerator.dispatch_batches = False
    accelerator.split_batches = False
    if args.dataloader_num_workers:
        log.warning("MixflowTrainer reads the sink in the training process: dataloader_num_workers is ignored")
    if args.max_steps <= 0:
        msg = "MixflowTrainer needs TrainingArguments(max_steps=...): the job's stream has no length"
        raise MixflowError(msg)
