"""A stand-in trainer for benchmarks: every rank of a job in lockstep, one step every ``--step-s`` seconds
of "compute", recording how long each step waited for its data.

    python -m benchmarks.paced_trainer --spec SPEC --out DIR --step-s 0.25

Run by ``mixflow run --trainer``; it reads each rank with the trainer sink (``KafkaBatchDataset``, which
reports each step taken on ``<job>.progress``) and writes ``DIR/paced-trainer.json``: per step, the
seconds the trainer waited for the micro-batches of every rank (what a GPU would idle), and the total.
It records what each rank received in ``DIR/received-rank<r>.jsonl``, as ``examples/train.py`` does, so
that ``mixflow run`` audits the delivery.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeline.spec import load_spec
from pipeline.tools.delivery import RECEIVED_FILE, received_line
from trainer_sink import KafkaBatchDataset, ReadOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-s", type=float, required=True, help="seconds of compute per step")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    datasets = [
        KafkaBatchDataset(args.spec, rank=r, read=ReadOptions(wait_timeout_s=600)) for r in range(spec.step.ranks)
    ]
    iterators = [iter(d) for d in datasets]
    args.out.mkdir(parents=True, exist_ok=True)
    received = [(args.out / RECEIVED_FILE.format(rank=r)).open("w") for r in range(spec.step.ranks)]
    waits: list[float] = []
    starts_ms: list[float] = []  # wall clock, to leave a warm-up out
    began = time.monotonic()
    try:
        while True:
            start = time.monotonic()
            starts_ms.append(time.time() * 1000)
            got = [[next(it) for _ in range(spec.step.micro_batches)] for it in iterators]
            waits.append(time.monotonic() - start)
            for file, micro_batches in zip(received, got, strict=True):
                file.writelines(received_line(mb) for mb in micro_batches)
            time.sleep(args.step_s)  # the step's compute
    except StopIteration:
        pass
    for file in received:
        file.close()
    result = {
        "step_s": args.step_s,
        "steps": len(waits),
        "waits_s": waits,
        "starts_ms": starts_ms[: len(waits)],
        "seconds": time.monotonic() - began,
    }
    (args.out / "paced-trainer.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
