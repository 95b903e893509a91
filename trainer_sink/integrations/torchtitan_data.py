"""mixflow in torchtitan: ``MixflowDataLoader``, a torchtitan dataloader over a job's rank topics.

    config = llama3_debugmodel()                          # any torchtitan Trainer.Config (Flex attention)
    config.tokenizer = NoTokenizer.Config(vocab_size=V)   # V: the job's tokenizer's; the model's must be as large
    config.dataloader = MixflowDataLoader.Config(spec="job.yaml", pad_to_multiple_of=64)
    config.training.local_batch_size = 1                  # one packed micro-batch per batch
    config.training.global_batch_size = dp_degree * M     # M: the job's step.micro_batches
    config.training.seq_len = C                           # at least the job's micro-batch capacity
    trainer = config.build()
    trainer.train()                                       # resumes from checkpoint.folder, if it holds one

What it does for the user:

- **Batches**: each micro-batch of the job is one torchtitan batch ``(input_dict, labels)``, packed:
  ``input_dict["input"]`` the samples' tokens concatenated, ``input_dict["positions"]`` restarting at 0 at
  each sample (torchtitan's ``Decoder`` builds its document masks from them, with Flex and varlen attention,
  the backends of its language models), ``labels`` the next token of the same sample and ``-100``
  (torchtitan's ``IGNORE_INDEX``) on each sample's last token and where the next token is not a target of the
  loss (a conversation's user turns): all int64 of shape ``[1, T]``.
  ``pad_to_multiple_of`` pads each to a multiple of that many tokens, which torchtitan's ``ChunkedLossWrapper``
  needs (a multiple of its ``num_chunks``, 8 by default); an empty micro-batch is one padding segment of that
  many tokens (one token by default) without labels. ``layout="padded"`` pads each to the
  job's micro-batch capacity instead (a fixed shape, for ``torch.compile``, CUDA graphs or pipeline
  parallelism). Nothing else goes in ``input_dict``: torchtitan gives all of it to the model's ``forward``.
  ``loader.step_micro_batches`` describes the micro-batches handed out of the current step (``step``,
  ``micro_batch``, ``sample_ids``, ``padding_tokens``).
- **Steps**: one training step per step of the job: torchtitan takes ``global_batch_size / (local_batch_size
  x data-parallel degree)`` batches a step, which must be the job's ``step.micro_batches``. The loader sees
  torchtitan's training step (``Trainer.train`` sets it before each, ``structured_logger.get_step()``) and
  refuses a micro-batch that begins a step of the job within a training step, or one in the middle of a step
  of the job that begins a training step; a checkpoint in the middle of a job's step is refused too. The
  stream ends at the job's end-of-data record, where torchtitan stops (``DataloaderExhaustedError``).
- **Ranks**: torchtitan builds the loader with the data-parallel rank and degree of its parallel dimensions
  (the ``batch`` mesh: ``dp_replicate x dp_shard``); tensor, context and pipeline parallel ranks of one
  data-parallel rank read the same rank topic. The job must have as many ranks as that degree.
- **Static context parallelism** (a job with ``step.context_parallel: {mode: static, size: C}``): under
  ``MixflowCPTrainer`` (``trainer_sink.integrations.torchtitan_cp_trainer``), which calls
  ``set_context_parallel``, rank ``c`` of each context-parallel group reads the job's rank ``dp_rank x C + c``,
  its own slices, as ``torchtitan_cp.titan_cp_batch`` lays them out; a rank with fewer micro-batches in a step
  than the job's most (``max_micro_batches``, which a training step then takes) gets empty ones after its last.
- **Checkpoints**: ``CheckpointManager`` saves ``state_dict()``, ``{"dp_rank_<r>": sink state (JSON),
  "world_size": W}`` like torchtitan's own dataloader, every rank its own key. torchtitan reads no batch
  ahead of the step it trains, so the state is the position after the checkpointed step.
- **Resume**: under ``torch.distributed.checkpoint`` a rank can only ask for keys the checkpoint holds, so
  every rank resumes from rank 0's state, finding that step on its own topic by number (ranks train in
  lockstep): under the same data-parallel degree or another (after ``mixflow replay --ranks``, reading the
  replayed job), which torchtitan's own dataloader refuses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.observability.structured_logger import get_step as training_step

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset
from trainer_sink.integrations.job_shape import require_data_parallel_size
from trainer_sink.integrations.torchtitan_cp import (
    check_cp_micro_batch,
    is_context_parallel,
    padded_to_max,
    titan_cp_batch,
)
from trainer_sink.media_tensors import VISION_KEYS
from trainer_sink.read_options import ReadOptions
from trainer_sink.tensors import Layout, MicroBatch

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX, the sink's label on a sample's last token
RANK_KEY = "dp_rank_{}"
WORLD_SIZE_KEY = "world_size"
METADATA_KEYS = ("step", "micro_batch", "micro_batches", "sample_ids", "padding_tokens")
MEDIA_KEYS = frozenset({*VISION_KEYS, "mm_token_type_ids"})


def titan_batch(
    micro_batch: MicroBatch, *, pad_token_id: int = 0, pad_to_multiple_of: int = 1
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One micro-batch of the sink as torchtitan's trainer takes a batch: ``({"input", "positions"}, labels)``,
    each int64 ``[1, T]``. An empty micro-batch becomes one padding segment of ``pad_to_multiple_of`` tokens."""
    input_ids = micro_batch["input_ids"].to(torch.int64)
    positions = micro_batch["position_ids"].to(torch.int64)
    labels = micro_batch["labels"].to(torch.int64)
    if input_ids.numel() == 0:
        input_ids = torch.full((pad_to_multiple_of,), pad_token_id, dtype=torch.int64)
        positions = torch.arange(pad_to_multiple_of, dtype=torch.int64)
        labels = torch.full((pad_to_multiple_of,), IGNORE_INDEX, dtype=torch.int64)
    return {"input": input_ids.unsqueeze(0), "positions": positions.unsqueeze(0)}, labels.unsqueeze(0)


class MixflowDataLoader(BaseDataLoader):
    """A job's micro-batches for torchtitan's ``Trainer`` (see the module's docstring). ``job=`` (with
    ``bootstrap_servers=`` or ``KAFKA_BOOTSTRAP_SERVERS``) or ``spec=`` names the job, or both (the spec's
    settings for that job)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        spec: str | None = None
        """The job's spec (YAML); with ``job``, its Kafka settings for that job."""

        job: str | None = None
        """The job's name, with ``bootstrap_servers`` or ``KAFKA_BOOTSTRAP_SERVERS``."""

        bootstrap_servers: str | None = None

        layout: str = "packed"
        """``packed`` (T tokens, as many as the micro-batch holds) or ``padded`` (the job's capacity)."""

        pad_token_id: int = 0

        pad_to_multiple_of: int = 1
        """Pad each packed micro-batch to a multiple of this many tokens (64: faster matrix products)."""

        wait_timeout_s: float = 600.0
        """How long to wait for the job's next batch before raising."""

    def __init__(
        self,
        config: Config,
        *,
        dp_rank: int,
        dp_world_size: int,
        local_batch_size: int = 1,
        seq_len: int | None = None,
        tokenizer: Any = None,
        snapshot_every_n_steps: int | None = None,
        sink: KafkaBatchDataset | None = None,
    ) -> None:
        del tokenizer, snapshot_every_n_steps  # the job's samples are tokenized; the sink's state is exact
        if local_batch_size != 1:
            msg = (
                f"MixflowDataLoader hands out one packed micro-batch per batch: set training.local_batch_size=1 "
                f"(not {local_batch_size}) and training.global_batch_size to the data-parallel degree times the "
                "job's step.micro_batches"
            )
            raise MixflowError(msg)
        self.config = config
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seq_len = seq_len
        self.cp_rank, self.cp_size = 0, 1
        self._context_parallel: bool = False  # told its place in the context-parallel mesh (MixflowCPTrainer)
        self._sink = sink  # made on first use, for the rank the loader is by then
        self.step_micro_batches: list[dict[str, Any]] = []
        self._iterated = False
        self._training_step: int | None = None  # torchtitan's training step of the last micro-batch handed out
        self._empty_tokens = config.pad_to_multiple_of if Layout(config.layout) is Layout.PACKED else 1

    @property
    def rank(self) -> int:
        """The job's rank this loader reads: its place in the data x context mesh (the data-parallel rank, where
        the loader reads no context-parallel job)."""
        return self.dp_rank * self.cp_size + self.cp_rank

    @property
    def sink(self) -> KafkaBatchDataset:
        if self._sink is None:
            self._sink = _sink(self.config, self.rank)
        return self._sink

    def set_context_parallel(self, cp_rank: int, cp_size: int) -> None:
        """Read a static context-parallel job as rank ``cp_rank`` of a context-parallel group of ``cp_size``: the
        job's rank ``dp_rank * cp_size + cp_rank``, its own slices (``MixflowCPTrainer`` calls it, before the
        loader reads anything)."""
        if self._sink is not None:
            msg = "set_context_parallel must come before the loader reads its job (its rank depends on it)"
            raise MixflowError(msg)
        if not 0 <= cp_rank < cp_size:
            msg = f"context-parallel rank {cp_rank} is not in 0..{cp_size - 1}"
            raise MixflowError(msg)
        self.cp_rank, self.cp_size, self._context_parallel = cp_rank, cp_size, True
        self._sink = _sink(self.config, self.rank)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        self._iterated = True
        return self._batches()

    def _batches(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        self._training_step = None
        for micro_batch in self.sink:
            if is_context_parallel(micro_batch) or self._context_parallel:
                yield from self._cp_batches(micro_batch)
                continue
            self._check(micro_batch)
            self._note(micro_batch)
            yield titan_batch(micro_batch, pad_token_id=self.config.pad_token_id, pad_to_multiple_of=self._empty_tokens)

    def _cp_batches(self, micro_batch: MicroBatch) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """A static context-parallel job's micro-batch, then empty ones to the job's ``max_micro_batches`` after
        the rank's last of its step (``trainer_sink.integrations.torchtitan_cp``)."""
        check_cp_micro_batch(
            micro_batch,
            topic=self.sink.topic,
            told=self._context_parallel,
            ranks=self.sink.state_dict().get("ranks"),
            dp_degree=self.dp_world_size,
            cp_degree=self.cp_size,
        )
        for one in padded_to_max(micro_batch):
            batch = titan_cp_batch(
                one,
                cp_rank=self.cp_rank,
                cp_size=self.cp_size,
                pad_token_id=self.config.pad_token_id,
                pad_to_multiple_of=self.config.pad_to_multiple_of,
            )
            self._check_tokens(one, batch[0]["input"].shape[1] * self.cp_size, "context_parallel_degree x ")
            padding = batch[0]["input"].shape[1] - one["input_ids"].numel()
            self._note({**one, "padding_tokens": padding})
            yield batch

    def _note(self, micro_batch: MicroBatch) -> None:
        """Check the micro-batch against torchtitan's training step, and describe it in ``step_micro_batches``."""
        self._check_training_step(micro_batch)
        if micro_batch["micro_batch"] == 0:
            self.step_micro_batches = []
        self.step_micro_batches.append({key: micro_batch[key] for key in METADATA_KEYS})

    def _check(self, micro_batch: MicroBatch) -> None:
        require_data_parallel_size(self.sink, self.dp_world_size, "torchtitan's data-parallel degree")
        self._check_tokens(micro_batch, micro_batch["input_ids"].numel(), "")
        if MEDIA_KEYS & micro_batch.keys():
            msg = f"MixflowDataLoader carries text only, and {self.sink.topic} is a job with media"
            raise MixflowError(msg)

    def _check_tokens(self, micro_batch: MicroBatch, tokens: int, times: str) -> None:
        if self.seq_len is not None and tokens > self.seq_len:
            msg = (
                f"micro-batch {micro_batch['micro_batch']} of step {micro_batch['step']} has {tokens} tokens, more "
                f"than training.seq_len ({self.seq_len}), which bounds the model's positions: set it to at least "
                f"{times}the job's micro-batch capacity"
            )
            raise MixflowError(msg)

    def _check_training_step(self, micro_batch: MicroBatch) -> None:
        """One training step of torchtitan's must take exactly one step of the job: a step of the job begins
        where a training step does. Not checked outside ``Trainer.train`` (no training step set)."""
        step = training_step()
        if step is None:
            return
        begins_job_step = micro_batch["micro_batch"] == 0
        if self._training_step is not None and begins_job_step != (step != self._training_step):
            how = "more" if begins_job_step else "fewer"
            degree, micro_batches = self.dp_world_size, micro_batch["micro_batches"]
            msg = (
                f"torchtitan's training step {self._training_step} takes {how} batches than the {micro_batches} "
                f"micro-batches of step {micro_batch['step'] - begins_job_step} of {self.sink.topic}: "
                "set training.global_batch_size to the data-parallel degree times the job's micro-batches a step "
                f"({degree} x {micro_batches} = {degree * micro_batches}), so that one training step is one step "
                "of the job"
            )
            raise MixflowError(msg)
        self._training_step = step

    # -- Stateful ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's sink state under ``dp_rank_<r>`` (``r``: ``rank``); before iterating, under ``dp_rank_0``:
        that is the key ``torch.distributed.checkpoint`` loads (it asks for the keys of this dict), which every
        checkpoint holds whatever its data-parallel degree."""
        state = self.sink.state_dict()
        if not self._iterated:
            return {RANK_KEY.format(0): json.dumps(state), WORLD_SIZE_KEY: self.dp_world_size * self.cp_size}
        if state.get("micro_batch") not in (0, None):
            msg = (
                f"torchtitan checkpoints in the middle of step {state['step']} of {self.sink.topic} (before "
                f"micro-batch {state['micro_batch']} of {state.get('micro_batches')}): set training.global_batch_size "
                "to the data-parallel degree times the job's step.micro_batches, so that one training step is one "
                "step of the job"
            )
            raise MixflowError(msg)
        return {RANK_KEY.format(self.rank): json.dumps(state), WORLD_SIZE_KEY: self.dp_world_size * self.cp_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from this rank's state if ``state_dict`` holds it, else from the lowest rank's."""
        if not state_dict:
            return
        ranks = sorted(int(key.removeprefix("dp_rank_")) for key in state_dict if key.startswith("dp_rank_"))
        if not ranks:
            msg = f"not a MixflowDataLoader state (no dp_rank_<r> key): {sorted(state_dict)}"
            raise MixflowError(msg)
        chosen = self.rank if self.rank in ranks else ranks[0]
        saved = state_dict[RANK_KEY.format(chosen)]
        self.sink.load_state_dict(json.loads(saved) if isinstance(saved, str | bytes) else saved)
        saved_world = state_dict.get(WORLD_SIZE_KEY)
        if saved_world is not None and saved_world != self.dp_world_size * self.cp_size:
            log.info(
                "rank %d of %d resumes from rank %d's state of a checkpoint taken at %d ranks",
                self.rank,
                self.dp_world_size * self.cp_size,
                chosen,
                saved_world,
            )


class NoTokenizer(BaseTokenizer):
    """The tokenizer of torchtitan's ``Trainer`` for a job whose samples are tokenized already: it reads no
    files (``hf_assets_path`` is not needed) and says the vocabulary size it is given (the job's tokenizer's,
    which the model's must cover); it encodes and decodes nothing."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int
        """The job's tokenizer's vocabulary size."""

    def __init__(self, config: Config, *, tokenizer_path: str | None = None) -> None:
        super().__init__()
        del tokenizer_path
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        msg = "the job's samples are tokenized already: NoTokenizer encodes nothing"
        raise MixflowError(msg)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        msg = "NoTokenizer decodes nothing: decode with the job's tokenizer"
        raise MixflowError(msg)

    def get_vocab_size(self) -> int:
        return self.vocab_size


def _sink(config: MixflowDataLoader.Config, dp_rank: int) -> KafkaBatchDataset:
    layout = Layout(config.layout)
    return KafkaBatchDataset(
        config.spec,
        job=config.job,
        bootstrap_servers=config.bootstrap_servers,
        rank=dp_rank,
        read=ReadOptions(
            layout=layout,
            pad_token_id=config.pad_token_id,
            attention_mask=False,  # torchtitan builds its masks from the positions
            pad_to_multiple_of=config.pad_to_multiple_of if layout is Layout.PACKED else 1,
            wait_timeout_s=config.wait_timeout_s,
        ),
    )
