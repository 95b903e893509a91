"""For the trainer integrations' tests: one stream of samples written as three jobs, laid out for 1, 2 and 3
data-parallel ranks (what ``mixflow replay --ranks`` makes of a job: the same samples in every step, split
over another number of ranks), training scripts run under torchrun on CPU (gloo), killed and resumed, and
the micro-batches they trained as they logged them."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.kafka_support import read_to_end
from tests.sink_support import write_steps
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch_message
from topics.formats.names import JobTopics

REPO = Path(__file__).resolve().parent.parent
MICRO_BATCHES, CAPACITY, STEPS = 2, 128, 12
SAVE_EVERY = 3
RUN_TIMEOUT_S = 240.0

Record = tuple[int, int, tuple[str, ...], str]
"""One micro-batch: (step, micro_batch, sample ids, sha256 of the samples' tokens as little-endian int32)."""


@dataclass(frozen=True)
class Jobs:
    """The same samples as one job per rank count: ``names[ranks]``; ``topics[ranks][rank]`` is what that
    rank topic holds, read back with the codec."""

    bootstrap: str
    names: dict[int, str]
    topics: dict[int, dict[int, list[Record]]]


def _step_samples(rng: np.random.Generator, step: int) -> list[tuple[str, np.ndarray]]:
    """Up to six samples of 4 to 40 tokens over 256 ids; every fourth step has five (an empty micro-batch at
    three ranks), and step 1 has a one-token sample (no label at all)."""
    count = 5 if step % 4 == 3 else 6
    samples = [
        (f"docs/s{step}-{i}/0", rng.integers(0, 256, int(rng.integers(4, 41)), dtype=np.int32)) for i in range(count)
    ]
    if step == 1:
        samples[0] = (f"docs/s{step}-0/0", np.array([7], np.int32))
    return samples


def _batch(samples: list[tuple[str, np.ndarray]], step: int, rank: int, ranks: int) -> Batch:
    """Rank ``rank``'s share of a step: sample ``j`` goes to bin ``j mod (ranks x micro-batches)``."""
    bins = ranks * MICRO_BATCHES
    mine = [(j % bins - rank * MICRO_BATCHES, s) for j, s in enumerate(samples) if j % bins // MICRO_BATCHES == rank]
    mine.sort(key=lambda item: item[0])
    pieces = [tokens for _, (_, tokens) in mine]
    lengths = [len(p) for p in pieces]
    return Batch.from_arrays(
        step=step,
        rank=rank,
        ranks=ranks,
        micro_batches=MICRO_BATCHES,
        capacity=CAPACITY,
        sample_ids=[sample_id for _, (sample_id, _) in mine],
        sources=["docs"] * len(mine),
        micro_batch=[m for m, _ in mine],
        offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
        tokens=np.concatenate(pieces) if pieces else np.zeros(0, np.int32),
    )


def write_jobs(bootstrap: str, label: str, rank_counts: tuple[int, ...] = (1, 2, 3)) -> Jobs:
    rng = np.random.default_rng(26)
    steps = [_step_samples(rng, step) for step in range(STEPS)]
    names, topics = {}, {}
    for ranks in rank_counts:
        name = f"t{uuid.uuid4().hex[:8]}-{label}-r{ranks}"
        write_steps(bootstrap, name, [[_batch(s, k, r, ranks) for r in range(ranks)] for k, s in enumerate(steps)])
        names[ranks] = name
        topics[ranks] = {r: topic_records(bootstrap, JobTopics(name).rank(r)) for r in range(ranks)}
        assert all(len(t) == STEPS * MICRO_BATCHES for t in topics[ranks].values()), "a rank topic is not whole"
    return Jobs(bootstrap, names, topics)


def topic_records(bootstrap: str, topic: str) -> list[Record]:
    """The micro-batches on a rank topic, decoded with the codec (not the sink), in order."""
    records = []
    for message in read_to_end(bootstrap, topic):
        if message.key() == b"end":
            continue
        batch = decode_batch_message(message)
        for m in range(batch.micro_batches):
            rows = np.flatnonzero(batch.micro_batch == m)
            lo, hi = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)
            data = batch.tokens[batch.offsets[lo] : batch.offsets[hi]].astype("<i4").tobytes()
            records.append((batch.step, m, tuple(batch.sample_ids[lo:hi]), hashlib.sha256(data).hexdigest()))
    return records


# -- running a training script under torchrun ----------------------------------------------------------------


def start(script: Path, processes: int, out: Path, *args: str) -> subprocess.Popen:
    """``torchrun --standalone --nproc_per_node processes script args``, logging to ``out/train.log``, in a
    process group of its own (so that a timeout ends its workers too)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    with open(out / "train.log", "ab") as log:
        return subprocess.Popen(
            [*command, str(script), *args], cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
        )


def finish(process: subprocess.Popen, out: Path) -> None:
    try:
        code = process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the trainer did not finish in {RUN_TIMEOUT_S} s; its log:\n{log_tail(out)}")
    assert code == 0, f"the trainer exited with {code}; its log:\n{log_tail(out)}"


def kill_rank_after(process: subprocess.Popen, out: Path, rank: int, lines: int) -> None:
    """SIGKILL worker ``rank`` once it has logged ``lines`` micro-batches; torchrun then ends the others."""
    log = out / f"received-rank{rank}.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while complete_lines(log) < lines:
        assert process.poll() is None, f"the trainer ended before it was killed; its log:\n{log_tail(out)}"
        assert time.monotonic() < deadline, f"rank {rank} logged no {lines} micro-batches in {RUN_TIMEOUT_S} s"
        time.sleep(0.005)  # poll interval of the progress probe
    os.kill(int((out / f"pid-rank{rank}").read_text()), signal.SIGKILL)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail("torchrun did not end its other workers within 60 s of the kill")
    assert code != 0, "torchrun exited 0 after one of its workers was killed"


def log_tail(out: Path) -> str:
    path = out / "train.log"
    return path.read_text(errors="replace")[-5000:] if path.exists() else "(no log)"


def complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def received(path: Path, start: int = 0) -> list[Record]:
    """The complete lines of a received-rank<r>.jsonl from byte ``start`` on."""
    if not path.exists():
        return []
    with open(path, "rb") as file:
        file.seek(start)
        lines = file.read().split(b"\n")
    rows = [json.loads(line) for line in lines[:-1] if line.strip()]  # the last piece is cut short or empty
    return [(r["step"], r["micro_batch"], tuple(r["sample_ids"]), r["tokens_sha256"]) for r in rows]


def record_line(step: int, micro_batch: int, sample_ids: list[str], tokens: np.ndarray) -> str:
    """A received-rank<r>.jsonl line, as the training scripts write it."""
    digest = hashlib.sha256(np.asarray(tokens).astype("<i4").tobytes()).hexdigest()
    return json.dumps({"step": step, "micro_batch": micro_batch, "sample_ids": sample_ids, "tokens_sha256": digest})
