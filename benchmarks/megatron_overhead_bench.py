"""The step time the Megatron-Core integration adds on Megatron-Core's own CPU schedule, against the same
schedule fed the same batches from memory.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/python -m benchmarks.megatron_overhead_bench [--steps 60]

As ``integration_overhead_bench.py`` does for the Hugging Face ``Trainer`` and Lightning: a job of ``--steps``
steps (1 rank x 2 micro-batches x ``--tokens`` tokens of random samples) written to its rank topic directly;
the tests' tiny Megatron-Core GPT (``tests/integration_megatron_train.py``, with a 50k vocabulary and the
same CPU stand-ins) trained in one process by ``get_forward_backward_func()``, twice:

- **memory**: the schedule over an iterator of the micro-batches as ``megatron_batch`` lays them out (with the
  dense ``attention_mask`` the CPU attention needs), built before the clock starts;
- **mixflow**: ``MixflowDataIterator`` reading the rank topic.

Step time: the median interval between consecutive optimizer steps, the first 5 left out. Timings are
printed, never asserted."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.integration_overhead_bench import MICRO_BATCHES, SKIPPED, written_job
from tests.integration_megatron_train import CpuForCuda, build_model, loss_func
from trainer_sink import KafkaBatchDataset
from trainer_sink.integrations.megatron_batch import megatron_batch
from trainer_sink.integrations.megatron_data import DataRanks, MixflowDataIterator, get_batch


def _forward_step(data_iterator: Iterator, model: torch.nn.Module):
    tokens, labels, loss_mask, attention_mask, position_ids, _ = get_batch(data_iterator)
    output = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output, partial(loss_func, loss_mask)


def _median_step(data: Iterator, steps: int, tokens: int) -> float:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    torch.manual_seed(0)
    model = build_model(vocab_size=50_000, max_sequence_length=tokens + 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward_backward = get_forward_backward_func()
    stamps = []
    for _ in range(steps):
        optimizer.zero_grad()
        with CpuForCuda():
            forward_backward(
                forward_step_func=_forward_step, data_iterator=data, model=[model], num_microbatches=MICRO_BATCHES,
                seq_length=tokens, micro_batch_size=1,
            )  # fmt: skip
        optimizer.step()
        stamps.append(time.perf_counter())
    gaps = np.diff(stamps[SKIPPED:])
    return float(statistics.median(gaps)) if gaps.size else float("nan")


def main() -> None:
    args, bootstrap, job = written_job(__doc__, "megatron")
    from megatron.core import parallel_state

    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{Path(folder) / 'store'}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        sink = KafkaBatchDataset(job=job, bootstrap_servers=bootstrap, report_progress=False)
        batches = [megatron_batch(m, attention_mask=True) for m in sink]
        memory = _median_step(iter(batches), args.steps, args.tokens)
        data = MixflowDataIterator(job=job, bootstrap_servers=bootstrap, ranks=DataRanks(0, 1), attention_mask=True)
        mixflow = _median_step(data, args.steps, args.tokens)
        data.close()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    print(f"| framework | memory: ms/step | mixflow: ms/step | added ms/step | ({args.steps} steps, {args.tokens} tok)")
    print("|---|---|---|---|")
    print(f"| Megatron-Core | {memory * 1e3:.2f} | {mixflow * 1e3:.2f} | {(mixflow - memory) * 1e3:+.2f} |")


if __name__ == "__main__":
    main()
