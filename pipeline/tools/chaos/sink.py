"""A chaos run's stand-in for one trainer rank: it reads its rank topic with ``KafkaBatchDataset`` and,
after each step, appends what it received to its record and checkpoints the sink's state with the
record's length. A process killed at any moment restarts from its checkpoint: the record is cut back to
that length and the sink resumes there, so the record holds every micro-batch exactly once.

    python -m pipeline.tools.chaos.sink --spec SPEC --rank R --out DIR [--bootstrap-servers HOST:PORT]

``DIR/received-rank<r>.jsonl`` is the record (``pipeline.tools.delivery.RECEIVED_FILE``'s format);
``DIR/sink-rank<r>.json`` the checkpoint. It ends at the job's end-of-data record. An error a user can cause
(the cluster refusing the trainer's principal, say) ends it with one line, ``chaos sink: error: ...``, and the
error's exit code (5 for a refusal), as a `mixflow` command ends.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

from pipeline.tools.chaos.sink_state import CHECKPOINT_FILE, SinkCheckpoint
from pipeline.tools.delivery import RECEIVED_FILE, received_line
from topics.errors import MixflowError


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_sink(spec: Path, rank: int, out: Path, bootstrap: str | None, wait_timeout_s: float) -> int:
    """Receive until the end of data; the number of steps received, over every restart."""
    from trainer_sink import KafkaBatchDataset, ReadOptions  # torch: only in the sink's own process

    out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out / CHECKPOINT_FILE.format(rank=rank)
    checkpoint = SinkCheckpoint.read(checkpoint_path)
    fd = os.open(out / RECEIVED_FILE.format(rank=rank), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        # Lines of a step after the last checkpoint are received again: they must not stay twice.
        os.ftruncate(fd, checkpoint.received_bytes)
        os.lseek(fd, checkpoint.received_bytes, os.SEEK_SET)
        dataset = KafkaBatchDataset(
            spec, bootstrap_servers=bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=wait_timeout_s)
        )
        if checkpoint.state is not None:
            dataset.load_state_dict(checkpoint.state)
        size, steps, lines = checkpoint.received_bytes, checkpoint.steps, []
        for micro_batch in dataset:
            lines.append(received_line(micro_batch))
            if micro_batch["micro_batch"] == micro_batch["micro_batches"] - 1:
                data = "".join(lines).encode()
                _write_all(fd, data)
                size, steps, lines = size + len(data), micro_batch["step"] + 1, []
                SinkCheckpoint(dataset.state_dict(), size, steps).write(checkpoint_path)
    finally:
        os.close(fd)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--wait-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # the chaos run asks a stuck sink for its stacks
    try:
        steps = run_sink(args.spec, args.rank, args.out, args.bootstrap_servers, args.wait_timeout_s)
    except MixflowError as exc:
        print(f"chaos sink: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    print(json.dumps({"rank": args.rank, "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
