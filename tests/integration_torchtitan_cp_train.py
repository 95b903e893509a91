"""A small torchtitan Llama 3 trained on a static context-parallel job by ``MixflowCPTrainer`` (torchtitan's own
``Trainer`` loop, FSDP and FlexAttention context parallelism) with context parallelism 2, each rank reading its own
slices: two processes under torchrun on CPU (gloo), the script tests/test_torchtitan_cp.py runs.

Rank 0 writes the model's weights before training (``OUT/weights.pt``), its gradients of step 1 (``OUT/grads.pt``)
and each step's global loss (``OUT/losses.jsonl``); every rank writes the batches it trained (``input`` and
``positions``, the loader's padding included) to ``OUT/batches-rank<r>.jsonl``.

torchtitan 0.3 assumes an accelerator: ``tests.cpu_stand_ins`` stands in for it. gloo has no ``PREMUL_SUM``,
which FSDP's reduce-scatter uses for torchtitan's gradient divide factor of 1: the script makes FSDP sum and scale
apart (``set_force_sum_reduction_for_comms``), the same gradients."""

from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch

from tests.cpu_stand_ins import torchtitan_eager_masks, torchtitan_on_cpu

torchtitan_on_cpu()
torchtitan_eager_masks()

# Imported after the stand-ins are in place: torchtitan's modules bind the device at import.
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

from tests.torchtitan_cp_support import (  # noqa: E402
    CAPACITY,
    CP,
    LOSS_CHUNKS,
    MOST_MICRO_BATCHES,
    NO_CLIPPING,
    STEPS,
    VOCABULARY,
)
from trainer_sink.integrations.torchtitan_cp_trainer import MixflowCPTrainer  # noqa: E402
from trainer_sink.integrations.torchtitan_data import MixflowDataLoader, NoTokenizer  # noqa: E402


class LoggingTrainer(MixflowCPTrainer):
    """Sums FSDP's reductions on gloo; writes the weights, step 1's gradients, the losses and the batches."""

    def __init__(self, config: MixflowCPTrainer.Config, out: Path) -> None:
        super().__init__(config)
        (model,) = self.model_parts
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        self.out = out
        self.rank = torch.distributed.get_rank()
        self.batches = open(out / f"batches-rank{self.rank}.jsonl", "a")  # noqa: SIM115
        self._save("weights.pt", {name: p.detach() for name, p in model.named_parameters()})
        log = self.metrics_processor.log

        def noted(step: int, loss: float, *args: Any, **kwargs: Any) -> None:
            if self.rank == 0:
                with open(out / "losses.jsonl", "a") as losses:
                    losses.write(json.dumps({"step": step, "loss": loss}) + "\n")
            log(step, loss, *args, **kwargs)

        self.metrics_processor.log = noted

    def _save(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """The tensors whole (FSDP shards each over the ranks), by the model's own names, from rank 0."""
        whole = {n.replace("_checkpoint_wrapped_module.", ""): t.full_tensor() for n, t in tensors.items()}
        if self.rank == 0:
            torch.save(whole, self.out / name)

    def post_dataloading_process(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor):
        row = {"step": self.step, **{key: input_dict[key][0].tolist() for key in ("input", "positions")}}
        self.batches.write(json.dumps(row) + "\n")
        self.batches.flush()
        return super().post_dataloading_process(input_dict, labels)

    def train_step(self, data_iterator: Any) -> None:
        super().train_step(data_iterator)
        if self.step == 1:
            (model,) = self.model_parts
            self._save("grads.pt", {name: p.grad for name, p in model.named_parameters()})


def config_for(job: str, bootstrap: str, out: Path) -> MixflowCPTrainer.Config:
    config = llama3_debugmodel()
    model = config.model_spec.model
    model.layers = model.layers[:2]
    config = MixflowCPTrainer.Config.of(config)
    config.parallelism.context_parallel_degree = CP
    config.parallelism.context_parallel_load_balancer = None
    config.parallelism.data_parallel_shard_degree = 1
    config.parallelism.data_parallel_replicate_degree = 1
    config.tokenizer = NoTokenizer.Config(vocab_size=VOCABULARY)
    config.dataloader = MixflowDataLoader.Config(
        job=job, bootstrap_servers=bootstrap, pad_to_multiple_of=LOSS_CHUNKS, wait_timeout_s=120
    )
    config.training.local_batch_size = 1
    config.training.global_batch_size = MOST_MICRO_BATCHES  # one data-parallel rank
    config.training.seq_len = CP * CAPACITY
    config.training.steps = STEPS
    config.training.mixed_precision_param = "float32"
    config.training.max_norm = NO_CLIPPING
    config.training.disable_cuda_graphs = True
    config.debug.seed = 0
    config.validator.enable = False
    config.checkpoint.enable = False
    config.dump_folder = str(out)
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    try:
        trainer = LoggingTrainer(config_for(args.job, args.bootstrap, args.out), args.out)
        try:
            trainer.train()
        finally:
            trainer.close()
    except BaseException:
        # torchrun's log ends with the peer's lost connection; the test shows this rank's own traceback
        (args.out / f"error-rank{os.environ.get('RANK', '0')}.txt").write_text(traceback.format_exc())
        raise
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
