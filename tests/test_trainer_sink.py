"""The trainer sink: tensors that agree with the batch, rank mapping, and against the real broker exact
resume from any point, waiting, end of data, and errors that say where."""

from __future__ import annotations

import itertools
import logging
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sink_support import random_batch, write_sink_spec, write_steps
from topics.errors import DecodeError, MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch
from topics.formats.names import JobTopics
from topics.formats.packing import IGNORE_INDEX
from trainer_sink import (
    KafkaBatchDataset,
    Layout,
    ParallelLayout,
    ReadOptions,
    SinkPosition,
    SinkTimeoutError,
    block_causal_mask,
    micro_batch_tensors,
    rank_from_environment,
)
from trainer_sink.buffer import ByteBoundedQueue, Closed

# -- pure ------------------------------------------------------------------------------------------


@settings(deadline=None, max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), micro_batches=st.integers(1, 4), capacity=st.integers(1, 300))
def test_packed_tensors_agree_with_the_batch(seed: int, micro_batches: int, capacity: int) -> None:
    batch = random_batch(np.random.default_rng(seed), 3, 1, 2, micro_batches, capacity)
    rows = batch.samples()
    out = micro_batch_tensors(batch)
    assert [mb["micro_batch"] for mb in out] == list(range(micro_batches))
    for m, mb in enumerate(out):
        group = [s for s, k in zip(rows, batch.micro_batch, strict=True) if k == m]
        assert mb["sample_ids"] == [s.sample_id for s in group]
        assert (mb["step"], mb["rank"], mb["micro_batches"]) == (3, 1, micro_batches)
        assert mb["input_ids"].dtype == mb["position_ids"].dtype == mb["cu_seqlens"].dtype == torch.int32
        assert mb["labels"].dtype == torch.int64
        cu = mb["cu_seqlens"].tolist()
        assert cu == [0, *itertools.accumulate(s.length for s in group)]
        assert mb["max_seqlen"] == max((s.length for s in group), default=0)
        for j, sample in enumerate(group):
            lo, hi = cu[j], cu[j + 1]
            assert mb["input_ids"][lo:hi].tolist() == sample.tokens.tolist()
            assert mb["position_ids"][lo:hi].tolist() == list(range(sample.length))
            # Next token of the same sample; never the first token of the next sample.
            assert mb["labels"][lo:hi].tolist() == [*sample.tokens[1:].tolist(), IGNORE_INDEX][: sample.length]


@settings(deadline=None, max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(1, 96))
def test_padded_tensors_have_a_fixed_shape_and_a_block_causal_mask(seed: int, capacity: int) -> None:
    batch = random_batch(np.random.default_rng(seed), 0, 0, 1, 2, capacity)
    for packed, padded in zip(micro_batch_tensors(batch), micro_batch_tensors(batch, Layout.PADDED), strict=True):
        n = packed["input_ids"].numel()
        for key in ("input_ids", "labels", "position_ids", "segment_ids"):
            assert padded[key].shape == (capacity,), key
        assert torch.equal(padded["input_ids"][:n], packed["input_ids"])
        assert torch.equal(padded["labels"][:n], packed["labels"])
        assert (padded["labels"][n:] == IGNORE_INDEX).all()
        segment = padded["segment_ids"].tolist()
        expected = [
            [(i == j) if segment[i] < 0 else (segment[i] == segment[j] and j <= i) for j in range(capacity)]
            for i in range(capacity)
        ]
        assert padded["attention_mask"].tolist() == expected
        assert torch.equal(block_causal_mask(padded["segment_ids"]), padded["attention_mask"])


@settings(deadline=None, max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(1, 200), multiple=st.integers(1, 64))
def test_packed_micro_batches_padded_to_a_multiple_keep_every_sample(seed: int, capacity: int, multiple: int) -> None:
    batch = random_batch(np.random.default_rng(seed), 0, 0, 1, 3, capacity)
    plain, padded = micro_batch_tensors(batch), micro_batch_tensors(batch, pad_to_multiple_of=multiple)
    for before, after in zip(plain, padded, strict=True):
        n, total = before["input_ids"].numel(), after["input_ids"].numel()
        assert total % multiple == 0 and n <= total < n + multiple and (n > 0 or total == 0)
        pad = total - n
        assert after["padding_tokens"] == pad and before["padding_tokens"] == 0
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(after[key][:n], before[key]), key
            assert after[key].dtype == before[key].dtype, key
        assert (after["labels"][n:] == IGNORE_INDEX).all()
        assert after["position_ids"][n:].tolist() == list(range(pad))
        assert after["cu_seqlens"].tolist() == before["cu_seqlens"].tolist() + ([total] if pad else [])
        assert after["max_seqlen"] == max(before["max_seqlen"], pad)
        assert after["sample_ids"] == before["sample_ids"]
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        micro_batch_tensors(batch, pad_to_multiple_of=0)


def test_padding_uses_the_pad_token() -> None:
    batches = (random_batch(np.random.default_rng(seed), 0, 0, 1, 1, 50) for seed in itertools.count())
    batch = next(b for b in batches if b.offsets[-1] > 0)
    (padded,) = micro_batch_tensors(batch, pad_token_id=7, pad_to_multiple_of=64)
    n = int(batch.offsets[-1])
    assert padded["input_ids"].numel() == 64 and (padded["input_ids"][n:] == 7).all()


@pytest.mark.parametrize("tensor,context,pipeline,data", [(1, 1, 1, 4), (2, 1, 1, 3), (2, 2, 2, 2), (4, 1, 2, 1)])
def test_peers_of_a_data_parallel_rank_share_it(tensor: int, context: int, pipeline: int, data: int) -> None:
    world = tensor * context * pipeline * data
    layout = ParallelLayout(world, tensor, context, pipeline)
    assert layout.data_parallel == data
    # Megatron's default order tp-cp-dp-pp: global = tp + T * (cp + C * (dp + D * pp)).
    for tp, cp, dp, pp in itertools.product(range(tensor), range(context), range(data), range(pipeline)):
        global_rank = tp + tensor * (cp + context * (dp + data * pp))
        assert layout.data_parallel_rank(global_rank) == dp
        env = {"RANK": str(global_rank), "WORLD_SIZE": str(world)}
        assert rank_from_environment(env, tensor=tensor, context=context, pipeline=pipeline) == (dp, data)


def test_bad_parallel_settings_are_refused() -> None:
    with pytest.raises(MixflowError, match="not a multiple"):
        ParallelLayout(6, tensor=4)
    with pytest.raises(MixflowError, match=r"global rank must be an int in \[0, 4\)"):
        ParallelLayout(4).data_parallel_rank(4)
    with pytest.raises(MixflowError, match="not a rank and a world size"):
        rank_from_environment({"RANK": "1"})
    assert rank_from_environment({}) == (0, 1)


def test_position_round_trips_and_refuses_bad_state() -> None:
    position = SinkPosition("j.rank.0").after(12, 4, 0, 2, ranks=3)
    assert position == SinkPosition("j.rank.0", 0, 12, 4, 1, ranks=3, micro_batches=2)
    assert position.after(12, 4, 1, 2, ranks=3) == SinkPosition("j.rank.0", 0, 12, 5, 0, 3, 2)
    assert SinkPosition.from_dict(position.to_dict()) == position
    assert not position.is_due(4, 0) and position.is_due(4, 1) and position.is_due(5, 0)
    with pytest.raises(MixflowError, match="'offset' must be a non-negative int or None"):
        SinkPosition.from_dict({**position.to_dict(), "offset": -1})
    with pytest.raises(MixflowError, match="'ranks' must be a positive int or None"):
        SinkPosition.from_dict({**position.to_dict(), "ranks": 0})
    with pytest.raises(MixflowError, match="version"):
        SinkPosition.from_dict({"topic": "j.rank.0"})
    # A state saved before the step shape was recorded still loads.
    older = {k: v for k, v in position.to_dict().items() if k not in ("ranks", "micro_batches")}
    assert SinkPosition.from_dict(older) == SinkPosition("j.rank.0", 0, 12, 4, 1)


def test_a_position_carries_over_to_another_topic_by_step() -> None:
    boundary = SinkPosition("old.rank.1", 0, 40, 9, 0, ranks=2, micro_batches=3)
    moved = boundary.on_topic("new.rank.2")
    assert moved == SinkPosition("new.rank.2", 0, None, 9, 0, 2, 3) and moved.seeks_step
    assert SinkPosition.from_dict(moved.to_dict()) == moved  # saved again before reading: still found by step
    assert boundary.on_topic("old.rank.1") is boundary
    assert SinkPosition("old.rank.0").on_topic("new.rank.0") == SinkPosition("new.rank.0")  # nothing delivered yet
    middle = SinkPosition("old.rank.0", 0, 40, 9, 2)  # saved before the shape was recorded
    with pytest.raises(MixflowError, match=r"in the middle of step 9 .* step boundary"):
        middle.on_topic("new.rank.0")


def test_the_prefetch_queue_holds_at_most_its_byte_limit() -> None:
    import threading

    queue = ByteBoundedQueue(100)
    sizes = [random.Random(7).randint(1, 60) for _ in range(200)] + [500]  # the last is over the limit alone

    def fill() -> None:
        for i, size in enumerate(sizes):
            queue.put(i, size)
        queue.close()

    writer = threading.Thread(target=fill)
    writer.start()
    got = []
    with pytest.raises(Closed):
        while True:
            got.append(queue.get())
    writer.join()
    assert got == list(range(len(sizes)))
    assert queue.peak_bytes <= 500 and max(sizes[:-1]) <= queue.peak_bytes


# -- against the broker -----------------------------------------------------------------------------

RANKS, MICRO_BATCHES, CAPACITY = 2, 3, 512


def _steps(seed: int, steps: int) -> list[list[Batch]]:
    rng = np.random.default_rng(seed)
    return [[random_batch(rng, s, r, RANKS, MICRO_BATCHES, CAPACITY) for r in range(RANKS)] for s in range(steps)]


def _fingerprint(micro_batch: dict) -> tuple:
    """Everything a trainer gets from one micro-batch, as comparable values."""
    tensors = tuple(micro_batch[k].numpy().tobytes() for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))
    return (micro_batch["step"], micro_batch["micro_batch"], tuple(micro_batch["sample_ids"]), *tensors)


def _take(iterator: Iterator[dict], n: int) -> list[tuple]:
    return [_fingerprint(mb) for mb in itertools.islice(iterator, n)]


@pytest.fixture(scope="module")
def written_job(kafka_bootstrap: str) -> tuple[str, list[list[Batch]]]:
    """A finished job of 24 steps, every third step preceded by an aborted attempt."""
    job = f"sink-{random.Random().getrandbits(32):08x}"
    batches = _steps(11, 24)
    write_steps(kafka_bootstrap, job, batches, aborted_every=3)
    return job, batches


@pytest.mark.kafka
def test_every_micro_batch_arrives_once_in_order_and_the_iteration_ends(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]]
) -> None:
    job, batches = written_job
    for rank in range(RANKS):
        dataset = KafkaBatchDataset(
            job=job, bootstrap_servers=kafka_bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=30)
        )
        got = [_fingerprint(mb) for mb in dataset]
        expected = [_fingerprint(mb) for step in batches for mb in micro_batch_tensors(step[rank])]
        assert got == expected
        assert list(dataset) == []  # the end stays the end
        assert dataset.state_dict()["step"] == len(batches)


@pytest.mark.kafka
def test_the_dataset_pads_micro_batches_when_asked(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]]
) -> None:
    job, batches = written_job
    with pytest.raises(MixflowError, match="pad_to_multiple_of"):
        KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(pad_to_multiple_of=0))
    dataset = KafkaBatchDataset(
        job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(pad_to_multiple_of=16)
    )
    got = [_fingerprint(mb) for mb in dataset]
    assert got == [_fingerprint(mb) for step in batches for mb in micro_batch_tensors(step[0], pad_to_multiple_of=16)]
    assert all(len(fingerprint[3]) % (16 * 4) == 0 for fingerprint in got)  # int32 input_ids


@pytest.mark.kafka
@pytest.mark.parametrize(
    "keywords",
    [{"pad_to_multiple_of": 16}, {"wait_timeout_s": 30, "layout": "padded"}, {"prefetch_bytes": 1 << 20}],
    ids=lambda keywords: ",".join(keywords),
)
def test_read_options_given_as_the_datasets_own_keywords_still_work_with_a_warning(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], keywords: dict[str, object]
) -> None:
    job, _ = written_job
    given = ", ".join(f"{name}=..." for name in keywords)
    with pytest.warns(DeprecationWarning, match=rf"pass read=ReadOptions\({re.escape(given)}\)"):
        old = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, **keywords)  # type: ignore[arg-type]
    new = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(**keywords))  # type: ignore[arg-type]
    assert old.options == new.options
    assert [_fingerprint(mb) for mb in old] == [_fingerprint(mb) for mb in new]
    with pytest.raises(TypeError, match="unexpected keyword argument 'pad_to'"):
        KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, pad_to=16)  # type: ignore[call-arg]


@pytest.mark.kafka
def test_resuming_from_any_point_yields_exactly_what_followed_it(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]]
) -> None:
    job, _ = written_job

    def dataset() -> KafkaBatchDataset:
        return KafkaBatchDataset(
            job=job, bootstrap_servers=kafka_bootstrap, rank=1, read=ReadOptions(wait_timeout_s=30, prefetch_bytes=4096)
        )

    reference = [_fingerprint(mb) for mb in dataset()]
    total = len(reference)
    points = sorted({0, 1, MICRO_BATCHES, total - 1, total, *random.Random(5).sample(range(total), 6)})
    for point in points:
        first = dataset()
        iterator = iter(first)
        assert _take(iterator, point) == reference[:point]
        state = first.state_dict()
        iterator.close()  # the reader had read ahead; none of that may count as delivered
        resumed = dataset()
        resumed.load_state_dict(state)
        assert [_fingerprint(mb) for mb in resumed] == reference[point:], f"resumed after {point} micro-batches"


@pytest.mark.kafka
def test_state_survives_torch_distributed_checkpoint(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], tmp_path: Path
) -> None:
    import torch.distributed.checkpoint as dcp

    job, _ = written_job
    first = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30))
    iterator = iter(first)
    _take(iterator, 7)
    iterator.close()
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"sink": first}, checkpoint_id=tmp_path)
    resumed = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30))
    with pytest.warns(UserWarning, match="single process"):
        dcp.load({"sink": resumed}, checkpoint_id=tmp_path)
    assert resumed.state_dict() == first.state_dict()
    assert next(iter(resumed))["step"] == 7 // MICRO_BATCHES


@pytest.mark.kafka
def test_under_a_dataloader(kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], tmp_path: Path) -> None:
    job, batches = written_job
    spec = write_sink_spec(tmp_path, job, kafka_bootstrap, RANKS, MICRO_BATCHES, CAPACITY)
    dataset = KafkaBatchDataset(spec, rank=0, read=ReadOptions(wait_timeout_s=30))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, pin_memory=torch.cuda.is_available())
    expected = [_fingerprint(mb) for step in batches for mb in micro_batch_tensors(step[0])]
    assert [_fingerprint(mb) for mb in loader] == expected
    workers = torch.utils.data.DataLoader(KafkaBatchDataset(spec, rank=0), batch_size=None, num_workers=1)
    with pytest.raises(MixflowError, match="num_workers=0"):
        next(iter(workers))


@pytest.mark.kafka
def test_a_spec_and_a_job_name_read_that_job_under_the_specs_settings(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], tmp_path: Path, unique_name: str
) -> None:
    """``spec=`` with ``job=``: the job of that name (one run with ``mixflow run --job``, or a replay under
    another number of ranks) with the spec's Kafka settings; the spec's ``step.ranks`` bound only its own job."""
    import yaml

    job, batches = written_job
    spec = tmp_path / "spec.yaml"
    kafka = {"bootstrap_servers": kafka_bootstrap, "config": {"client.id": "from-the-spec"}}
    spec.write_text(yaml.safe_dump({"job": unique_name, "kafka": kafka, "step": {"ranks": 1}}))
    dataset = KafkaBatchDataset(spec, job=job, rank=RANKS - 1, read=ReadOptions(wait_timeout_s=30))
    assert dataset.topic == JobTopics(job).rank(RANKS - 1) and dataset.kafka_config["client.id"] == "from-the-spec"
    expected = [_fingerprint(mb) for step in batches for mb in micro_batch_tensors(step[RANKS - 1])]
    assert [_fingerprint(mb) for mb in dataset] == expected
    with pytest.raises(MixflowError, match=r"rank 1 is not below the job's step.ranks \(1\)"):
        KafkaBatchDataset(spec, job=unique_name, rank=1)
    with pytest.raises(MixflowError, match="job name"):
        KafkaBatchDataset(spec, job="no/such job", rank=0)


@pytest.mark.kafka
def test_peers_of_one_data_parallel_rank_read_the_same_batches(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, _ = written_job
    spec = write_sink_spec(tmp_path, job, kafka_bootstrap, RANKS, MICRO_BATCHES, CAPACITY)
    # World of 8: tensor 2 x pipeline 2 x data 2. Ranks 2, 3 (tp peers) and 6 (pipeline stage 1) are dp rank 1.
    monkeypatch.setenv("WORLD_SIZE", "8")
    streams = []
    for global_rank in (2, 3, 6):
        monkeypatch.setenv("RANK", str(global_rank))
        dataset = KafkaBatchDataset(spec, tensor_parallel=2, pipeline_parallel=2, read=ReadOptions(wait_timeout_s=30))
        assert dataset.topic == JobTopics(job).rank(1)
        streams.append([_fingerprint(mb) for mb in dataset])
    assert streams[0] == streams[1] == streams[2]
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(MixflowError, match=r"rank 2 is not below the job's step.ranks \(2\)"):
        KafkaBatchDataset(spec, global_rank=4, world_size=6, tensor_parallel=2)


@pytest.mark.kafka
def test_waits_for_the_constructor_then_times_out_naming_the_step(
    kafka_bootstrap: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    batches = _steps(3, 6)
    write_steps(kafka_bootstrap, unique_name, batches[:2], end=False)
    dataset = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=20)
    )
    iterator = iter(dataset)
    assert len(_take(iterator, 2 * MICRO_BATCHES)) == 2 * MICRO_BATCHES
    # The sink has everything written so far; the next steps arrive while it waits for them.
    write_steps(kafka_bootstrap, unique_name, batches[2:], end=True)
    rest = [_fingerprint(mb) for mb in iterator]
    assert rest == [_fingerprint(mb) for step in batches[2:] for mb in micro_batch_tensors(step[0])]

    stalled = f"{unique_name}-stalled"
    write_steps(kafka_bootstrap, stalled, batches[:1], end=False)
    waiting = KafkaBatchDataset(
        job=stalled,
        bootstrap_servers=kafka_bootstrap,
        rank=1,
        read=ReadOptions(wait_timeout_s=1.0, wait_log_interval_s=0.2),
    )
    iterator = iter(waiting)
    _take(iterator, MICRO_BATCHES)
    with pytest.raises(SinkTimeoutError, match=rf"waited \d+ s for step 1 on {stalled}\.rank\.1"):
        next(iterator)
    # Said while waiting at a level a training script's default logging shows (Python's: WARNING).
    waits = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(f" s for step 1 on {stalled}.rank.1" in wait and "rank 1 has waited" in wait for wait in waits)


@pytest.mark.kafka
def test_a_corrupt_batch_names_topic_partition_and_offset(kafka_bootstrap: str, unique_name: str) -> None:
    batches = _steps(4, 2)
    write_steps(kafka_bootstrap, unique_name, batches[:1], end=False)
    topic = JobTopics(unique_name).rank(0)
    _, value, headers = encode_batch(batches[1][0])
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    offsets: list[int] = []
    # Truncated in half. Its offset is read back: the previous transaction's commit marker may land after it.
    producer.produce(
        topic,
        value[: len(value) // 2],
        key=b"1",
        headers=headers,
        on_delivery=lambda _err, message: offsets.append(message.offset()),
    )
    producer.flush(30)
    dataset = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30)
    )
    iterator = iter(dataset)
    assert len(_take(iterator, MICRO_BATCHES)) == MICRO_BATCHES  # what came before is delivered
    where = rf"topic={topic}, partition=0, offset={offsets[0]}\): not a readable Arrow"
    with pytest.raises(DecodeError, match=where):
        next(iterator)


@pytest.mark.kafka
def test_a_gap_in_the_steps_is_an_error_not_a_silent_skip(kafka_bootstrap: str, unique_name: str) -> None:
    batches = _steps(5, 4)
    write_steps(kafka_bootstrap, unique_name, [batches[0], batches[1], batches[3]], end=False)
    dataset = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30)
    )
    with pytest.raises(DecodeError, match="step 3 follows step 1: steps are missing or repeated"):
        list(dataset)


@pytest.mark.kafka
def test_one_iterator_at_a_time(kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]]) -> None:
    job, _ = written_job
    dataset = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30))
    first = iter(dataset)
    with pytest.raises(MixflowError, match="already being iterated"):
        iter(dataset)
    with pytest.raises(MixflowError, match="while the dataset is being iterated"):
        dataset.load_state_dict(dataset.state_dict())
    head = _take(first, 2)
    assert dataset.peak_prefetch_bytes > 0  # seen while the iteration runs
    first.close()
    assert _take(iter(dataset), 1)[0][:2] == (0, 2)  # the next pass goes on after the two handed out
    assert head[1][:2] == (0, 1)


# -- resuming on another rank topic (another rank count: see mixflow replay) ----------------------------------


def _other_shape(seed: int, steps: range, ranks: int = 3, micro_batches: int = 2) -> list[list[Batch]]:
    rng = np.random.default_rng(seed)
    return [[random_batch(rng, s, r, ranks, micro_batches, CAPACITY) for r in range(ranks)] for s in steps]


@pytest.mark.kafka
def test_a_state_saved_on_another_rank_count_resumes_at_its_step(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]], unique_name: str
) -> None:
    job, _ = written_job
    wider = _other_shape(8, range(24))
    write_steps(kafka_bootstrap, unique_name, wider)
    old = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=1, read=ReadOptions(wait_timeout_s=30))
    iterator = iter(old)
    _take(iterator, 4 * MICRO_BATCHES)  # steps 0-3, whole
    at_boundary = old.state_dict()
    _take(iterator, 1)
    mid_step = old.state_dict()
    iterator.close()
    assert (at_boundary["step"], at_boundary["micro_batch"], mid_step["micro_batch"]) == (4, 0, 1)

    for new_rank in range(3):  # any old rank's state will do for any new rank
        dataset = KafkaBatchDataset(
            job=unique_name, bootstrap_servers=kafka_bootstrap, rank=new_rank, read=ReadOptions(wait_timeout_s=30)
        )
        dataset.load_state_dict(at_boundary)
        assert dataset.state_dict()["topic"] == JobTopics(unique_name).rank(new_rank)
        expected = [_fingerprint(mb) for step in wider[4:] for mb in micro_batch_tensors(step[new_rank])]
        assert [_fingerprint(mb) for mb in dataset] == expected

    refused = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30)
    )
    refused.load_state_dict(mid_step)
    with pytest.raises(MixflowError, match=r"middle of step 4 .* 3 micro-batches on 2 ranks, here it has 2 on 3"):
        next(iter(refused))

    later = f"{unique_name}-later"  # a replay from step 10
    write_steps(kafka_bootstrap, later, _other_shape(9, range(10, 24)))
    missing = KafkaBatchDataset(
        job=later, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30)
    )
    missing.load_state_dict(at_boundary)
    with pytest.raises(MixflowError, match=rf"resume at step 4 on {later}\.rank\.0: it holds no step 4; .* step 10"):
        next(iter(missing))

    ended = KafkaBatchDataset(job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30))
    list(ended)
    at_end = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=2, read=ReadOptions(wait_timeout_s=30)
    )
    at_end.load_state_dict(ended.state_dict())
    assert list(at_end) == [] and at_end.state_dict()["step"] == 24


@pytest.mark.kafka
def test_a_state_carried_to_a_topic_not_written_that_far_waits_for_its_step(
    kafka_bootstrap: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    wider = _other_shape(10, range(8))
    write_steps(kafka_bootstrap, unique_name, wider[:3], end=False)
    dataset = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=1, read=ReadOptions(wait_timeout_s=30)
    )
    dataset.load_state_dict(SinkPosition("old.rank.0", 0, 40, 5, 0, ranks=2, micro_batches=3).to_dict())
    with caplog.at_level("INFO", logger="trainer_sink.start"):
        iterator = iter(dataset)
        deadline = time.monotonic() + 30
        while not any("holds no step 5 yet" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the reader never looked for step 5"
            time.sleep(0.01)  # polls the log for the reader thread's search, not a synchronisation delay
    write_steps(kafka_bootstrap, unique_name, wider[3:])
    expected = [_fingerprint(mb) for step in wider[5:] for mb in micro_batch_tensors(step[1])]
    assert [_fingerprint(mb) for mb in iterator] == expected


@settings(deadline=None, max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), multiple=st.sampled_from([1, 8, 64]))
def test_the_example_counts_labels_without_reading_them_padding_or_not(seed: int, multiple: int) -> None:
    """``examples/gpt.label_count`` on a device infers the count from the shapes: it must agree with the
    labels themselves, with the sink's padding segment or without."""
    from examples import gpt

    class OnDevice(torch.Tensor):  # the labels as a trainer sees them on a GPU: not to be read
        @property
        def device(self) -> torch.device:  # type: ignore[override]
            return torch.device("meta")

    batch = random_batch(np.random.default_rng(seed), 0, 0, 1, 3, 150)
    for micro_batch in micro_batch_tensors(batch, pad_to_multiple_of=multiple):
        counted = int((micro_batch["labels"] != IGNORE_INDEX).sum())
        assert gpt.label_count(micro_batch) == counted
        assert gpt.label_count({**micro_batch, "labels": micro_batch["labels"].as_subclass(OnDevice)}) == counted


_LEFT_OPEN = """
import atexit, sys, threading

def readers_alive_at_the_end():  # registered first, so it runs after the sink's own exit handler
    alive = [t.name for t in threading.enumerate() if t.name.startswith("mixflow-sink-")]
    print("alive:", alive, flush=True)

atexit.register(readers_alive_at_the_end)
from trainer_sink import KafkaBatchDataset, ReadOptions
read = ReadOptions(wait_timeout_s=30)
iterator = iter(KafkaBatchDataset(job=sys.argv[1], bootstrap_servers=sys.argv[2], rank=0, read=read))
next(iterator)
keep = iterator  # left open, as a trainer stopping at max_steps leaves it
"""


@pytest.mark.kafka
def test_a_sink_left_open_stops_its_reading_thread_before_the_process_exits(
    kafka_bootstrap: str, written_job: tuple[str, list[list[Batch]]]
) -> None:
    """A reading thread still inside torch when the interpreter finalizes aborts the process; the sink's exit
    handler closes every reader a framework left open first."""
    job, _ = written_job
    command = [sys.executable, "-c", _LEFT_OPEN, job, kafka_bootstrap]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alive: []" in done.stdout, done.stdout + done.stderr[-3000:]
