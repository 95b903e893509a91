"""A context-parallel job through the real constructor: its long samples span blocks of ranks, each rank's
topic holds only its slices, and every sample of the sources comes back exactly once, token for token, from the
slices of its block; a constructor killed mid-job resumes and writes the very records an uninterrupted run does."""

from __future__ import annotations

import json
import random
import signal
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.kafka_support import TopicGrowth
from tests.loader_support import SOURCES, build_example_data, load_sources, start_constructor, write_spec
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end

RANKS, CAPACITY, LONGEST = 4, 128, 512


@pytest.fixture(scope="module")
def loaded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The example's sources, samples up to 512 tokens, loaded once; a spec of 4 ranks of 128 tokens a
    micro-batch with aligned context parallelism, and every source sample by id."""
    folder = tmp_path_factory.mktemp("cp-job")
    data = build_example_data(folder / "data", limit=30)
    job = f"cp{random.randrange(16**8):08x}"
    spec = write_spec(
        folder,
        job,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        step={
            "ranks": RANKS,
            "micro_batches": 2,
            "tokens_per_micro_batch": CAPACITY,
            "context_parallel": {"mode": "aligned", "size": RANKS},
        },
    )
    text = spec.read_text().replace("max_sample_length: 512", f"max_sample_length: {LONGEST}")
    spec.write_text(text)
    load_sources(spec, folder)
    samples = {}
    for source in SOURCES:
        for message in read_to_end({"bootstrap.servers": kafka_bootstrap}, JobTopics(job).src(source), timeout_s=60):
            sample = decode_sample_message(message)
            samples[sample.sample_id] = np.asarray(sample.tokens)
    return spec, samples


def _rank_records(bootstrap: str, job: str) -> list[list]:
    topics = JobTopics(job)
    return [read_to_end({"bootstrap.servers": bootstrap}, topics.rank(r), timeout_s=60) for r in range(RANKS)]


def _batches(records: list[list]) -> list[list[CPBatch]]:
    out = []
    for messages in records:
        assert end_of_data_steps(messages[-1].headers()) == len(messages) - 1, "the job did not end"
        batches = [decode_any_batch_message(m) for m in messages[:-1]]
        assert all(isinstance(b, CPBatch) for b in batches)
        assert [b.step for b in batches] == list(range(len(batches)))
        out.append(batches)
    return out


def test_every_sample_comes_back_exactly_once_from_its_blocks_slices(
    kafka_bootstrap: str, loaded: tuple[Path, dict], tmp_path: Path
) -> None:
    spec, samples = loaded
    job = f"cpo{random.randrange(16**8):08x}"
    process = start_constructor(spec, job)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()[-3000:]
    per_rank = _batches(_rank_records(kafka_bootstrap, job))
    pieces: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
    sizes: Counter[int] = Counter()
    for rank, batches in enumerate(per_rank):
        for batch in batches:
            assert batch.mode == "aligned" and batch.ranks == RANKS and batch.capacity == CAPACITY
            offsets, tokens, positions = batch.offsets, batch.tokens, batch.positions
            for row, sample_id in enumerate(batch.sample_ids):
                part = slice(offsets[row], offsets[row + 1])
                assert rank not in pieces[sample_id], f"{sample_id} twice on rank {rank}"
                pieces[sample_id][rank] = (tokens[part], positions[part])
                first = rank - int(batch.cp_rank[row])
                c = int(batch.cp_size[row])
                assert first % c == 0 and c & (c - 1) == 0, "not an aligned power-of-two block"
                if batch.cp_rank[row] == 0:
                    sizes[c] += 1
    assert sorted(pieces) == sorted(samples), "samples lost"
    assert sizes[1] and sum(n for c, n in sizes.items() if c > 1), f"no sample spans a block: {sizes}"
    for sample_id, held in pieces.items():
        tokens = samples[sample_id]
        whole = np.full(tokens.size + 2 * RANKS, -1, np.int64)
        for part_tokens, part_positions in held.values():
            whole[part_positions] = part_tokens
        np.testing.assert_array_equal(whole[: tokens.size], tokens, err_msg=sample_id)
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["finished"] is True


def test_a_killed_constructor_resumes_to_the_same_records(
    kafka_bootstrap: str, loaded: tuple[Path, dict], tmp_path: Path
) -> None:
    spec, _ = loaded
    whole_job, killed_job = (f"cp{k}{random.randrange(16**8):08x}" for k in ("w", "k"))
    uninterrupted = start_constructor(spec, whole_job)
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err.decode()[-3000:]
    expected = _rank_records(kafka_bootstrap, whole_job)
    growth = TopicGrowth(kafka_bootstrap, [JobTopics(killed_job).state])
    rng = random.Random(5)
    for _ in range(2):
        process = start_constructor(spec, killed_job, log=tmp_path / "constructor.log")
        growth.wait_for(growth.records() + rng.randint(1, 8), lambda p=process: p.poll() is None, timeout_s=120)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    growth.close()
    process = start_constructor(spec, killed_job, log=tmp_path / "constructor.log")
    assert process.wait(timeout=300) == 0, (tmp_path / "constructor.log").read_text()[-3000:]
    got = _rank_records(kafka_bootstrap, killed_job)
    for rank, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert [m.value() for m in g] == [m.value() for m in e], f"rank {rank}: other records"
