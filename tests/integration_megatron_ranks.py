"""Under torchrun, with gloo: ``parallel_state`` set up for each of ``--layouts`` in turn (tensor x context x pipeline
parallel sizes, such as ``2x1x1``), then what ``megatron_data`` makes of this process (``DataRanks.here()``,
``needs_data()``) written to ``OUT/<layout>/rank<global rank>.json``: the script tests/test_integration_megatron.py
runs (one launch for every layout: each costs the processes' start-up, which is most of the time)."""

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
    parser.add_argument("--layouts", required=True, help="TENSORxCONTEXTxPIPELINE, comma-separated")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    for layout in args.layouts.split(","):
        tensor, context, pipeline = (int(size) for size in layout.split("x"))
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor,
            pipeline_model_parallel_size=pipeline,
            context_parallel_size=context,
        )
        ranks = DataRanks.here()
        record = {
            "data_parallel_rank": ranks.data_parallel_rank,
            "data_parallel_size": ranks.data_parallel_size,
            "context_parallel": ranks.context_parallel,
            "writes_state": ranks.writes_state,
            "needs_data": needs_data(),
        }
        folder = args.out / layout
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
