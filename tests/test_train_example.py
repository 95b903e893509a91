"""examples/train.py end to end against rank topics written directly (no loaders, no constructor): it
trains to the end of data with the loss going down, logs exactly the micro-batches of its topic, resumes
after SIGKILL exactly where its checkpoint left off, and runs as two DDP ranks under torchrun."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
import yaml

from tests.kafka_support import read_to_end
from tests.sink_support import write_steps
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch_message
from topics.formats.names import JobTopics

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "train.py"
RANKS, MICRO_BATCHES, CAPACITY, STEPS = 2, 2, 192, 36
CHECKPOINT_EVERY = 4
RUN_TIMEOUT_S = 150.0

Record = tuple[int, int, tuple[str, ...], str]
"""One micro-batch as the trainer logs it: (step, micro_batch, sample ids, sha256 of the int32 tokens)."""


@dataclass(frozen=True)
class Job:
    name: str
    spec: Path
    bootstrap: str
    topics: dict[int, list[Record]]  # rank -> its micro-batches, as read back from the topic


# -- a small job with repeated documents ------------------------------------------------------------------


def _corpus(rng: np.random.Generator) -> list[np.ndarray]:
    """Eight documents of 24 to 90 tokens over 256 ids, each seen many times: a model learns them fast."""
    return [rng.integers(0, 256, int(rng.integers(24, 91)), dtype=np.int32) for _ in range(8)]


def _batches(rng: np.random.Generator) -> list[list[Batch]]:
    """``batches[step][rank]``: documents packed into micro-batches in turn, plus the corner cases a
    trainer must survive: an empty last micro-batch on rank 0 (the one DDP synchronises on), an empty
    first one on rank 1, and a one-token sample (no label at all)."""
    corpus = _corpus(rng)
    seen = 0
    out = []
    for step in range(STEPS):
        step_batches = []
        for rank in range(RANKS):
            ids, micro, pieces = [], [], []
            for m in range(MICRO_BATCHES):
                if (step, rank, m) in ((2, 0, 1), (3, 1, 0)):
                    continue
                room = CAPACITY
                if (step, rank, m) == (1, 0, 0):
                    ids.append("docs/single/0")
                    micro.append(m)
                    pieces.append(np.array([7], np.int32))
                    room -= 1
                while len(doc := corpus[seen % len(corpus)]) <= room:
                    ids.append(f"docs/doc{seen % len(corpus)}/0@e{seen // len(corpus)}")
                    micro.append(m)
                    pieces.append(doc)
                    room -= len(doc)
                    seen += 1
            lengths = [len(p) for p in pieces]
            batch = Batch.from_arrays(
                step=step,
                rank=rank,
                ranks=RANKS,
                micro_batches=MICRO_BATCHES,
                capacity=CAPACITY,
                sample_ids=ids,
                sources=["docs"] * len(ids),
                micro_batch=micro,
                offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
                tokens=np.concatenate(pieces) if pieces else np.zeros(0, np.int32),
            )
            step_batches.append(batch)
        out.append(step_batches)
    return out


def _topic_records(bootstrap: str, topic: str) -> list[Record]:
    """The micro-batches on a rank topic, decoded with the codec (not the sink), in order."""
    records = []
    for message in read_to_end(bootstrap, topic):
        if message.key() == b"end":
            continue
        batch = decode_batch_message(message)
        ids, offsets, tokens = batch.sample_ids, batch.offsets, batch.tokens
        for m in range(batch.micro_batches):
            rows = np.flatnonzero(batch.micro_batch == m)
            lo, hi = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)
            data = tokens[offsets[lo] : offsets[hi]].astype("<i4").tobytes()
            records.append((batch.step, m, tuple(ids[lo:hi]), hashlib.sha256(data).hexdigest()))
    return records


@pytest.fixture(scope="module")
def job(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Job:
    name = f"t{uuid.uuid4().hex[:8]}-train-example"
    write_steps(kafka_bootstrap, name, _batches(np.random.default_rng(7)))
    spec = tmp_path_factory.mktemp("spec") / "job.yaml"
    body = {
        "job": name,
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "step": {"ranks": RANKS, "micro_batches": MICRO_BATCHES, "tokens_per_micro_batch": CAPACITY},
    }
    spec.write_text(yaml.safe_dump(body))
    topics = {r: _topic_records(kafka_bootstrap, JobTopics(name).rank(r)) for r in range(RANKS)}
    assert all(len(t) == STEPS * MICRO_BATCHES for t in topics.values()), "the rank topics were not written whole"
    return Job(name, spec, kafka_bootstrap, topics)


# -- running the trainer ----------------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _train_command(job: Job, out: Path, *extra: str) -> list[str]:
    return [
        str(TRAIN),
        "--spec",
        str(job.spec),
        "--out",
        str(out),
        "--bootstrap-servers",
        job.bootstrap,
        "--device",
        "cpu",
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--threads",
        "1",
        "--wait-timeout-s",
        "60",
        "--log-every-s",
        "1",
        *extra,
    ]


def _start(job: Job, out: Path, *extra: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "ab") as log:  # the child keeps its own descriptor
        return _popen([sys.executable, *_train_command(job, out, *extra)], log)


def _popen(command: list[str], log: BinaryIO) -> subprocess.Popen:
    """In a process group of its own, so a timeout ends torchrun's workers too."""
    return subprocess.Popen(command, cwd=REPO, env=_environment(), stdout=log, stderr=log, start_new_session=True)


def _finish(process: subprocess.Popen, out: Path) -> None:
    try:
        code = process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the trainer did not finish in {RUN_TIMEOUT_S} s; its log:\n{_log_tail(out)}")
    assert code == 0, f"the trainer exited with {code}; its log:\n{_log_tail(out)}"


def _log_tail(out: Path) -> str:
    path = out / "train.log"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def _received(path: Path, start: int = 0) -> list[Record]:
    """The complete lines of a received-rank<r>.jsonl from byte ``start`` on."""
    records = []
    with open(path, "rb") as file:
        file.seek(start)
        for line in file.read().split(b"\n"):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            records.append((row["step"], row["micro_batch"], tuple(row["sample_ids"]), row["tokens_sha256"]))
    return records


def _complete_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_bytes().count(b"\n")


@pytest.fixture(scope="module")
def reference_run(job: Job, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted single-process run to the end of the data."""
    out = tmp_path_factory.mktemp("reference")
    _finish(_start(job, out), out)
    return out


# -- tests ------------------------------------------------------------------------------------------------


def test_one_process_trains_to_the_end_and_sees_exactly_its_topic(job: Job, reference_run: Path) -> None:
    summary = json.loads((reference_run / "trainer-rank0.json").read_text())
    assert summary["rank"] == 0 and summary["steps"] == STEPS and summary["end_step"] == STEPS
    assert summary["micro_batches"] == STEPS * MICRO_BATCHES
    assert summary["tokens"] > 0 and summary["tokens_per_s"] > 0 and summary["prefetch_peak_bytes"] > 0
    assert summary["rss_bytes"] > 0
    assert summary["loss_last"] < 0.6 * summary["loss_first"], f"the loss did not go down: {summary}"
    received = _received(reference_run / "received-rank0.jsonl")
    assert received == job.topics[0], "received-rank0.jsonl differs from the micro-batches on the topic"
    latest = json.loads((reference_run / "checkpoint" / "latest.json").read_text())
    assert latest["step"] == STEPS


@pytest.mark.parametrize("kill_seed", [11, 12, 13])
def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
    job: Job, reference_run: Path, tmp_path: Path, kill_seed: int
) -> None:
    reference = _received(reference_run / "received-rank0.jsonl")
    # Kill once the trainer has logged `target` micro-batches: past the first checkpoint or not.
    target = random.Random(kill_seed).randrange(2, len(reference) - 8)
    out = tmp_path / "run"
    received_path = out / "received-rank0.jsonl"
    # One run trains on padded micro-batches: the samples it logs must be the reference's all the same.
    padding = ("--pad-to-multiple-of", "64") if kill_seed == 13 else ()
    process = _start(job, out, *padding)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while _complete_lines(received_path) < target:
        assert process.poll() is None, f"the trainer ended (code {process.returncode}) before it was killed"
        assert time.monotonic() < deadline, f"the trainer logged no {target} micro-batches in {RUN_TIMEOUT_S} s"
        time.sleep(0.005)  # poll interval of the progress probe
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    killed_at = received_path.stat().st_size
    before = _received(received_path)
    assert before == reference[: len(before)], "before the kill, the trainer saw other micro-batches"
    latest = out / "checkpoint" / "latest.json"
    checkpoint_step = json.loads(latest.read_text())["step"] if latest.exists() else 0
    assert checkpoint_step * MICRO_BATCHES <= len(before), "the checkpoint is ahead of what the trainer logged"

    _finish(_start(job, out, "--resume", *padding), out)
    after = _received(received_path, killed_at)
    expected = [r for r in reference if r[0] >= checkpoint_step]
    assert after == expected, (
        f"killed after {len(before)} micro-batches (target {target}), checkpoint at step {checkpoint_step}: the "
        f"resumed run saw {len(after)} micro-batches from step {after[0][0] if after else None}, expected "
        f"{len(expected)} from step {checkpoint_step}"
    )
    summary = json.loads((out / "trainer-rank0.json").read_text())
    assert summary["first_step"] == checkpoint_step and summary["end_step"] == STEPS


def test_two_ranks_under_torchrun_each_see_their_topic(job: Job, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(RANKS),
        *_train_command(job, out),
    ]
    with open(out / "train.log", "wb") as log:
        process = _popen(command, log)
    _finish(process, out)
    summaries = [json.loads((out / f"trainer-rank{r}.json").read_text()) for r in range(RANKS)]
    for rank in range(RANKS):
        assert _received(out / f"received-rank{rank}.jsonl") == job.topics[rank], f"rank {rank} saw other batches"
        assert summaries[rank]["steps"] == STEPS and summaries[rank]["rank"] == rank
    # The loss is normalised over the whole global step, so every rank logs the same one.
    assert summaries[0]["loss_last"] == pytest.approx(summaries[1]["loss_last"])
    assert summaries[0]["loss_last"] < summaries[0]["loss_first"]


def test_a_run_resumes_under_another_world_size(job: Job, tmp_path: Path) -> None:
    """One process trains the first steps on rank 0's topic; two processes go on from its checkpoint,
    rank 1 from rank 0's sink state, found by step on its own topic: each sees exactly its topic's rest."""
    out = tmp_path / "elastic"
    first = STEPS // 3
    _finish(_start(job, out, "--steps", str(first)), out)
    assert json.loads((out / "checkpoint" / "latest.json").read_text())["world_size"] == 1
    logs = [out / f"received-rank{r}.jsonl" for r in range(RANKS)]
    sizes = [path.stat().st_size if path.exists() else 0 for path in logs]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS)]
    with open(out / "train.log", "ab") as log:
        process = _popen([*command, *_train_command(job, out, "--resume")], log)
    _finish(process, out)
    for rank in range(RANKS):
        after = _received(logs[rank], sizes[rank])
        assert after == [r for r in job.topics[rank] if r[0] >= first], f"rank {rank} resumed at other batches"
        summary = json.loads((out / f"trainer-rank{rank}.json").read_text())
        assert summary["first_step"] == first and summary["end_step"] == STEPS
