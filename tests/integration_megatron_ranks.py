"""Under torchrun, with gloo: ``parallel_state`` set up for ``--tensor``, ``--context`` and ``--pipeline``
parallel sizes, then what ``megatron_data`` makes of this process (``DataRanks.here()``, ``needs_data()``)
written to ``OUT/rank<global rank>.json``: the script tests/test_integration_megatron.py runs."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist
from megatron.core import parallel_state

from trainer_sink.integrations.megatron_data import DataRanks, needs_data


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("tensor", "context", "pipeline"):
        parser.add_argument(f"--{name}", type=int, default=1)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor,
        pipeline_model_parallel_size=args.pipeline,
        context_parallel_size=args.context,
    )
    ranks = DataRanks.here()
    record = {
        "data_parallel_rank": ranks.data_parallel_rank,
        "data_parallel_size": ranks.data_parallel_size,
        "context_parallel": ranks.context_parallel,
        "writes_state": ranks.writes_state,
        "needs_data": needs_data(),
    }
    (args.out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
