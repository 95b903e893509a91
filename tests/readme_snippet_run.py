"""One of the README's trainer snippets as torchrun starts it, on CPU: ``readme_snippet_run.py FRAMEWORK FOLDER``
runs ``FOLDER/train.py`` in ``FOLDER`` (tests/test_readme_snippets.py writes both). The snippets are written for
GPUs; what a CPU lacks is stood in for here, and nothing else: torchtitan's and Megatron-Core's CUDA
(``tests.cpu_stand_ins``), and torchtitan's sharded data parallelism, replicated instead (FSDP's reduce-scatter
uses ``PREMUL_SUM``, which gloo does not have)."""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from typing import Any

from tests.cpu_stand_ins import CpuForCuda, megatron_on_cpu, torchtitan_on_cpu


def replicate_torchtitans_data_parallelism() -> None:
    from torchtitan.trainer import Trainer

    build = Trainer.__init__

    def replicated(self: Trainer, config: Trainer.Config, *args: Any, **kwargs: Any) -> None:
        config.parallelism.data_parallel_replicate_degree = int(os.environ.get("WORLD_SIZE", "1"))
        config.parallelism.data_parallel_shard_degree = 1
        config.training.disable_cuda_graphs = True
        build(self, config, *args, **kwargs)

    Trainer.__init__ = replicated


def main() -> None:
    framework, folder = sys.argv[1:3]
    os.chdir(folder)
    on_cpu: Any = contextlib.nullcontext()
    if framework == "torchtitan":
        torchtitan_on_cpu()
        replicate_torchtitans_data_parallelism()
    elif framework == "megatron":
        megatron_on_cpu()
        on_cpu = CpuForCuda()
    with on_cpu:
        runpy.run_path("train.py", run_name="__main__")


if __name__ == "__main__":
    main()
