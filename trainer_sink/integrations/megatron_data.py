"""mixflow in Megatron-Core and Megatron-LM: ``MixflowDataIterator``, the data iterator of a training run.

Megatron-LM (``pretrain_gpt.py`` with ``--dataloader-type external --micro-batch-size 1 --global-batch-size
<data-parallel size x M>``, M the job's ``step.micro_batches``): the datasets provider returns the iterator,
which Megatron uses as the train data iterator as it is::

    def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
        args = get_args()
        if not needs_data(vp_stage):                      # a middle pipeline stage, a tensor-parallel rank > 0
            return None, None, None
        data = MixflowDataIterator(job="my-job", seq_length=args.seq_length, save=args.save,
                                   save_interval=args.save_interval, train_iters=args.train_iters,
                                   start_iteration=args.iteration)
        if args.iteration:                                # resumed: Megatron loaded the checkpoint first
            data.load_checkpoint(args.load, args.iteration)
        return data, None, None
    train_valid_test_datasets_provider.is_distributed = True

A loop of one's own on Megatron-Core: ``forward_step`` takes the batch with ``get_batch(data_iterator)``
(``tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params``, on this context-parallel
rank's share) and ``get_forward_backward_func()`` runs the step's micro-batches over the iterator;
``data.save_checkpoint(folder, iteration)`` beside the model's checkpoint, before its tracker file.

What it does for the user:

- **Batches**: one micro-batch of the job per ``next()``, as ``megatron_batch`` lays it out (``tokens``,
  ``labels``, ``loss_mask``, ``position_ids``, ``cu_seqlens``, ``max_seqlen``, ``packed_seq_params``, and
  ``attention_mask`` with ``attention_mask=True``): packed, samples apart by ``PackedSeqParams`` (THD).
  ``micro_batch_info`` is the current micro-batch's ``step``, ``micro_batch``, ``sample_ids`` and
  ``padding_tokens``.
- **Steps**: one training iteration per step of the job: Megatron's ``get_num_microbatches()`` (or
  ``num_microbatches=``) must be the job's ``step.micro_batches``; checked at every micro-batch.
- **Ranks**: the data-parallel rank and size from ``megatron.core.parallel_state`` (or given); tensor,
  context and pipeline-parallel peers of a data-parallel rank read the same rank topic, so each gets the
  same micro-batch. Only the first and last pipeline stages need data (``needs_data``); Megatron-LM reads it
  on tensor-parallel rank 0 and broadcasts it. Context parallel: each sample is padded to a multiple of
  ``2 x cp`` tokens and every context-parallel rank reads the whole micro-batch; ``get_batch`` keeps this
  rank's share (Megatron-Core's ``get_thd_batch_on_this_cp_rank``, which needs Transformer Engine, or
  ``get_batch_on_this_cp_rank`` with ``attention_mask``). The job must have as many ranks as the
  data-parallel size.
- **Checkpoints**: ``save_checkpoint(root, iteration)`` writes this data-parallel rank's sink state into
  Megatron's folder of that iteration (``root/iter_0000100/mixflow-sink-rank<r>.json``; one writer per
  data-parallel rank). With ``save`` and ``save_interval`` the iterator does it by itself when it hands out
  the last micro-batch of iteration ``k`` with ``k`` a multiple of ``save_interval`` (or ``train_iters``):
  before Megatron saves that iteration and writes its tracker file. Megatron-Core's ``dist_checkpointing``
  then logs that it overwrites an incomplete checkpoint there: the folder is not empty, which is harmless.
- **Resume**: ``load_checkpoint(root, iteration)`` (the iteration of Megatron's tracker file by default)
  loads the sink state of that iteration: of this rank, or rank 0's under another data-parallel size (after
  ``mixflow replay --ranks``, reading the replayed job), found by step on its own topic. A checkpoint without
  sink state is refused rather than starting the stream over.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.core import num_microbatches_calculator, parallel_state

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset, SinkIterator
from trainer_sink.integrations.job_shape import require_data_parallel_size
from trainer_sink.integrations.megatron_batch import megatron_batch
from trainer_sink.integrations.megatron_cp import is_context_parallel, megatron_cp_batch
from trainer_sink.integrations.sink_checkpoint import read_sink_state, write_sink_state
from trainer_sink.media_tensors import VISION_KEYS
from trainer_sink.parallel import rank_from_environment
from trainer_sink.read_options import ReadOptions

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's: the last whole checkpoint's iteration
INFO_KEYS = ("step", "micro_batch", "micro_batches", "sample_ids")


def iteration_folder(root: str | os.PathLike[str], iteration: int) -> Path:
    """Megatron's checkpoint folder of ``iteration`` under ``root`` (``--save``/``--load``)."""
    return Path(root) / f"iter_{iteration:07d}"


def latest_iteration(root: str | os.PathLike[str]) -> int | None:
    """The iteration Megatron's tracker file in ``root`` names, or ``None`` without one."""
    tracker = Path(root) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        msg = f"{tracker} names {text!r}, not an iteration: a release checkpoint has no data position to resume"
        raise MixflowError(msg)
    return int(text)


@dataclass(frozen=True, slots=True)
class DataRanks:
    """Where this process stands for the data: its data-parallel rank and size, the context-parallel size, and
    whether it writes its data-parallel rank's sink state (one process of the rank's peers does)."""

    data_parallel_rank: int
    data_parallel_size: int
    context_parallel: int = 1
    writes_state: bool = True

    @classmethod
    def here(cls) -> DataRanks:
        """From ``megatron.core.parallel_state`` once initialized, else from ``RANK``/``WORLD_SIZE``."""
        if not parallel_state.model_parallel_is_initialized():
            rank, size = rank_from_environment()
            return cls(rank, size)
        first = (
            parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_context_parallel_rank() == 0
            and parallel_state.is_pipeline_first_stage(ignore_virtual=True)
        )
        return cls(
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
            first,
        )


def needs_data(vp_stage: int | None = None) -> bool:
    """Whether Megatron-LM reads the data iterator in this process: tensor-parallel rank 0 of the first or the
    last pipeline stage (``get_batch_on_this_tp_rank`` broadcasts to the other tensor-parallel ranks)."""
    if not parallel_state.model_parallel_is_initialized():
        return True
    return parallel_state.get_tensor_model_parallel_rank() == 0 and _first_or_last_stage(vp_stage)


class MixflowDataIterator(Iterator[dict[str, Any]]):
    """A job's micro-batches for Megatron (see the module's docstring). ``spec`` or ``job=`` (with
    ``bootstrap_servers=`` or ``kafka_config=``, or ``KAFKA_BOOTSTRAP_SERVERS``) name the job, or both (the
    spec's settings for that job)."""

    def __init__(
        self,
        spec: str | os.PathLike[str] | None = None,
        *,
        job: str | None = None,
        bootstrap_servers: str | None = None,
        kafka_config: dict[str, Any] | None = None,
        ranks: DataRanks | None = None,
        num_microbatches: int | None = None,
        seq_length: int | None = None,
        pad_token_id: int = 0,
        pad_to_multiple_of: int = 1,
        attention_mask: bool = False,
        save: str | os.PathLike[str] | None = None,
        save_interval: int | None = None,
        train_iters: int | None = None,
        start_iteration: int = 0,
        device: torch.device | str | None = None,
        wait_timeout_s: float = 600.0,
        sink: KafkaBatchDataset | None = None,
    ) -> None:
        self.ranks = ranks if ranks is not None else DataRanks.here()
        if save is not None and not save_interval and train_iters is None:
            msg = "save= needs save_interval= or train_iters=: the iterations whose sink state to write"
            raise MixflowError(msg)
        if sink is None:
            sink = _sink(spec, job, bootstrap_servers, kafka_config, self.ranks, device, wait_timeout_s)
        self.sink = sink
        self.layout: dict[str, Any] = {  # megatron_batch's keywords
            "pad_token_id": pad_token_id,
            "context_parallel": self.ranks.context_parallel,
            "seq_length": seq_length,
            "pad_to_multiple_of": pad_to_multiple_of,
            "attention_mask": attention_mask,
        }
        self.num_microbatches = num_microbatches
        self.save, self.save_interval, self.train_iters = save, save_interval, train_iters
        self.iteration = start_iteration
        self.micro_batch_info: dict[str, Any] | None = None
        self._batches: SinkIterator | None = None

    def __iter__(self) -> MixflowDataIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._batches is None:
            self._batches = iter(self.sink)
        micro_batch = next(self._batches)
        try:
            if is_context_parallel(micro_batch):
                self._check_context_parallel(micro_batch)
                batch = megatron_cp_batch(micro_batch, pad_token_id=self.layout["pad_token_id"])
            else:
                self._check(micro_batch)
                batch = megatron_batch(micro_batch, **self.layout)
        except BaseException:
            self.close()  # a refused batch ends the run: stop the reader thread with it
            raise
        self.micro_batch_info = {key: micro_batch[key] for key in INFO_KEYS}
        self.micro_batch_info["padding_tokens"] = batch["tokens"].shape[1] - micro_batch["input_ids"].numel()
        if micro_batch["micro_batch"] == micro_batch["micro_batches"] - 1:
            self.iteration += 1
            if self.save is not None and self._saves(self.iteration):
                self.save_checkpoint(self.save, self.iteration)
        return batch

    def close(self) -> None:
        """Stop the sink's reader thread and its Kafka consumer."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    def _saves(self, iteration: int) -> bool:
        return bool(self.save_interval and iteration % self.save_interval == 0) or iteration == self.train_iters

    def _check(self, micro_batch: dict[str, Any]) -> None:
        require_data_parallel_size(self.sink, self.ranks.data_parallel_size, "Megatron's data-parallel size")
        wanted = self.num_microbatches if self.num_microbatches is not None else _megatron_microbatches()
        if wanted is not None and micro_batch["micro_batches"] != wanted:
            msg = (
                f"step {micro_batch['step']} of {self.sink.topic} has {micro_batch['micro_batches']} micro-batches, "
                f"but Megatron runs {wanted} a step: set --global-batch-size to the data-parallel size times the "
                "job's step.micro_batches (with --micro-batch-size 1), so that one iteration is one step of the job"
            )
            raise MixflowError(msg)
        if VISION_KEYS & micro_batch.keys():
            msg = f"MixflowDataIterator carries text only, and {self.sink.topic} is a job with media"
            raise MixflowError(msg)

    def _check_context_parallel(self, micro_batch: dict[str, Any]) -> None:
        """A context-parallel job's ranks run as many micro-batches as their slices take, step by step: the
        loop gives ``forward_backward_func`` ``num_microbatches=micro_batch_info['micro_batches']`` (Megatron-Core
        with ``--hybrid-context-parallel``); every rank of the data x context mesh reads its own topic."""
        if self.ranks.context_parallel > 1:
            msg = (
                f"{self.sink.topic} is a context-parallel job's (mixflow plans the blocks): read it with one topic "
                "per rank of the data x context mesh (DataRanks(context_parallel=1, data_parallel_rank=its index))"
            )
            raise MixflowError(msg)

    # -- state and checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The sink's position: always at the start of a step (a checkpoint in the middle of one is refused)."""
        state = self.sink.state_dict()
        if state.get("micro_batch") not in (0, None):
            msg = (
                f"a checkpoint in the middle of step {state['step']} of {self.sink.topic} (before micro-batch "
                f"{state['micro_batch']} of {state.get('micro_batches')}): Megatron checkpoints between iterations, "
                "and one iteration must be one step of the job (--global-batch-size)"
            )
            raise MixflowError(msg)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sink.load_state_dict(state)

    def save_checkpoint(self, root: str | os.PathLike[str], iteration: int) -> Path | None:
        """Write the sink state into Megatron's folder of ``iteration`` under ``root``, from the one process of
        this data-parallel rank that writes it (``None`` elsewhere)."""
        if not self.ranks.writes_state:
            return None
        state = self.state_dict()
        folder = iteration_folder(root, iteration)
        return write_sink_state(folder, self.ranks.data_parallel_rank, self.ranks.data_parallel_size, state)

    def load_checkpoint(self, root: str | os.PathLike[str], iteration: int | None = None) -> int | None:
        """Resume at the sink state of ``iteration`` (by default the one of Megatron's tracker file in ``root``);
        the iteration loaded, or ``None`` when ``root`` has no checkpoint."""
        if iteration is None:
            iteration = latest_iteration(root)
            if iteration is None:
                return None
        self.load_state_dict(read_sink_state(iteration_folder(root, iteration), self.ranks.data_parallel_rank))
        self.iteration = iteration
        return iteration


def get_batch(data_iterator: Iterator[dict[str, Any]] | None, vp_stage: int | None = None) -> tuple[Any, ...]:
    """``pretrain_gpt.py``'s ``get_batch`` for a loop on Megatron-Core that gives every tensor-parallel rank its
    own iterator: ``(tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params)`` of the next
    micro-batch, this context-parallel rank's share of it; all ``None`` on a middle pipeline stage."""
    if parallel_state.model_parallel_is_initialized() and not _first_or_last_stage(vp_stage):
        return (None,) * 6
    if data_iterator is None:
        msg = "get_batch without a data iterator on a pipeline stage that needs data"
        raise MixflowError(msg)
    batch = dict(next(data_iterator))
    params = batch.pop("packed_seq_params")
    if "local_cp_size" in batch:  # a context-parallel job's: already this rank's slices
        batch.setdefault("attention_mask", None)
        keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
        return (*(batch[key] for key in keys), params)
    cu_seqlens, max_seqlen = batch.pop("cu_seqlens"), batch.pop("max_seqlen")
    batch.setdefault("attention_mask", None)
    if _context_parallel() > 1:
        from megatron.core.utils import get_batch_on_this_cp_rank, get_thd_batch_on_this_cp_rank

        if batch["attention_mask"] is not None:
            batch = get_batch_on_this_cp_rank(batch)
            params = None
        else:
            batch, params = get_thd_batch_on_this_cp_rank(batch, cu_seqlens[0], cu_seqlens[0], max_seqlen)
    elif batch["attention_mask"] is not None:
        params = None  # the mask keeps the samples apart, for attention without THD
    keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
    return (*(batch[key] for key in keys), params)


def _first_or_last_stage(vp_stage: int | None) -> bool:
    virtual = {"ignore_virtual": vp_stage is None, "vp_stage": vp_stage}
    return parallel_state.is_pipeline_first_stage(**virtual) or parallel_state.is_pipeline_last_stage(**virtual)


def _context_parallel() -> int:
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_context_parallel_world_size()


def _megatron_microbatches() -> int | None:
    """Megatron's current micro-batches per iteration, when its calculator is set up."""
    try:
        return num_microbatches_calculator.get_num_microbatches()
    except AttributeError:  # no calculator: Megatron-LM's initialize was not run
        return None


def _sink(
    spec: str | os.PathLike[str] | None,
    job: str | None,
    bootstrap_servers: str | None,
    kafka_config: dict[str, Any] | None,
    ranks: DataRanks,
    device: torch.device | str | None,
    wait_timeout_s: float,
) -> KafkaBatchDataset:
    return KafkaBatchDataset(
        spec,
        job=job,
        bootstrap_servers=bootstrap_servers,
        kafka_config=kafka_config,
        rank=ranks.data_parallel_rank,
        read=ReadOptions(
            attention_mask=False,
            pad_to_multiple_of=1,  # megatron_batch pads, for context parallelism as well
            wait_timeout_s=wait_timeout_s,
        ),
        device=device,
    )
