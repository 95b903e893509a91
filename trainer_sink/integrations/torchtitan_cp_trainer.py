"""mixflow's static context parallelism in torchtitan: ``MixflowCPTrainer``, torchtitan's ``Trainer`` over a job whose
spec sets ``step.context_parallel: {mode: static, size: C}``, every rank reading only its own slices.

    config = MixflowCPTrainer.Config.of(llama3_debugmodel())       # any Trainer.Config, FlexAttention
    config.dataloader = MixflowDataLoader.Config(spec="job.yaml", pad_to_multiple_of=64)
    config.parallelism.context_parallel_degree = C                 # the job's step.context_parallel.size
    config.parallelism.context_parallel_load_balancer = None       # the slices are balanced already
    config.training.global_batch_size = dp_degree * M              # M: the job's most micro-batches a step
    config.training.seq_len = C * T                                # T: the job's tokens_per_micro_batch
    trainer = config.build()
    trainer.train()

torchtitan's own context parallelism has every rank of a context-parallel group read the whole micro-batch and cut
it (``prepare_context_parallel_input``); here the job's constructor has cut it already, and each rank's topic
holds only its slices (``C`` times fewer bytes). What changes against ``Trainer``:

- **The loader's rank**: torchtitan builds its loader with the ``batch`` mesh's rank ``b``; this tells it its place
  ``c`` in the ``cp`` mesh (``MixflowDataLoader.set_context_parallel``), and it reads the job's rank ``b x C + c``.
- **No second cut**: ``post_dataloading_process`` shards nothing and builds the attention mask of the rank's
  queries over the keys and values the group all-gathers (``apply_cp_to_forward``'s ``flex_cp_allgather``, or the
  ``spmd_types``/``full_dtensor`` backends' declared all-gather): same sample, causal by position in the sample
  (``trainer_sink.integrations.torchtitan_cp``).
- **The loss's divisor**: torchtitan divides each rank's summed loss by the loss tokens of its ``batch`` mesh,
  which here would count one rank's slices of each group; it is the step's ``loss_tokens`` over every rank instead.

Refused with one line: another attention than FlexAttention, a context-parallel load balancer (it would stand for a
cut that does not happen), a job of another mode (per micro-batch, by the loader).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torchtitan.distributed import full_dtensor
from torchtitan.distributed.spmd_types import annotate_input_spmd_types
from torchtitan.distributed.utils import is_in_batch_invariant_mode
from torchtitan.models.common import attention as titan_attention
from torchtitan.models.common.decoder import Decoder
from torchtitan.trainer import Trainer

from topics.errors import MixflowError
from trainer_sink.integrations.torchtitan_cp import BLOCK_KEYS, cp_block_mask
from trainer_sink.integrations.torchtitan_data import MixflowDataLoader


class MixflowCPTrainer(Trainer):
    """torchtitan's ``Trainer`` over a static context-parallel job's slices (see the module's docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        @classmethod
        def of(cls, config: Trainer.Config) -> MixflowCPTrainer.Config:
            """``config`` (any ``Trainer.Config``, a config registry's) as the config that builds this trainer."""
            return cls(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})

    def __init__(self, config: Config) -> None:
        self.block_size = _check(config)
        super().__init__(config)
        dims = self.parallel_dims
        self.cp_rank = dims.get_mesh("cp").get_local_rank() if dims.cp_enabled else 0
        self.dataloader.set_context_parallel(self.cp_rank, dims.cp)

    def forward_backward_step(
        self,
        *,
        input_dict: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]],
        labels: torch.Tensor | list[torch.Tensor],
        global_valid_tokens: torch.Tensor,
    ) -> torch.Tensor:
        first = input_dict[0] if isinstance(input_dict, list) else input_dict
        loss_tokens = first["loss_tokens"].reshape(()).clamp(min=1)  # the same in every micro-batch of the step
        return super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=loss_tokens.to(global_valid_tokens)
        )

    def post_dataloading_process(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        inputs = input_dict["input"]
        extra_kwargs: dict[str, Any] = {k: v for k, v in input_dict.items() if k != "input" and k not in BLOCK_KEYS}
        extra_kwargs["attention_masks"] = cp_block_mask(
            input_dict["block_documents"],
            input_dict["block_positions"],
            self.cp_rank,
            self.parallel_dims.cp,
            create=titan_attention.create_attention_mask,  # compiled, as torchtitan builds its own masks
            BLOCK_SIZE=self.block_size,
            separate_full_blocks=not is_in_batch_invariant_mode(),
        )
        self.ntokens_seen += labels.numel()
        backend = self.config.parallelism.spmd_backend
        if backend == "full_dtensor":
            inputs, labels, extra_kwargs = full_dtensor.parallelize_inputs(
                self.parallel_dims, inputs, labels, extra_kwargs
            )
        elif backend == "spmd_types":
            inputs, labels, extra_kwargs = annotate_input_spmd_types(self.parallel_dims, inputs, labels, extra_kwargs)
        return inputs, labels, extra_kwargs


def _check(config: Trainer.Config) -> Any:
    """The FlexAttention block size of ``config``'s model; ``MixflowError`` for what cannot train the slices."""
    if not isinstance(config.dataloader, MixflowDataLoader.Config):
        kind = type(config.dataloader).__name__
        msg = f"MixflowCPTrainer reads a mixflow job: set config.dataloader to MixflowDataLoader.Config, not {kind}"
        raise MixflowError(msg)
    model = config.model_spec.model if config.model_spec is not None else None
    attention = model.first_attention if isinstance(model, Decoder.Config) else None
    inner = getattr(attention, "inner_attention", None)
    if not isinstance(inner, titan_attention.FlexAttention.Config):
        msg = (
            f"MixflowCPTrainer needs a decoder with FlexAttention (attn_backend='flex'), not "
            f"{type(inner).__qualname__}: the mask of a rank's queries over its group's gathered keys is a BlockMask"
        )
        raise MixflowError(msg)
    balancer = config.parallelism.context_parallel_load_balancer
    if balancer is not None:
        msg = (
            f"parallelism.context_parallel_load_balancer={balancer!r}: the job's slices are balanced already (head "
            "and tail of each sample) and MixflowCPTrainer cuts nothing again; set it to None"
        )
        raise MixflowError(msg)
    return inner.block_size
