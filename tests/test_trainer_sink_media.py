"""The trainer sink on a job with media, against the real broker: every micro-batch carries its vision inputs,
decoded on the reading thread (never the trainer's), and a resumed dataset yields exactly what followed."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import trainer_sink.vlm.qwen2_vl
from tests.sink_media_support import media_sample
from tests.sink_support import write_steps
from topics.errors import DecodeError
from topics.formats.batch import Batch
from trainer_sink import KafkaBatchDataset, Layout, ReadOptions, micro_batch_tensors

RANKS, MICRO_BATCHES, STEPS = 2, 2, 4
KINDS = [[], [("image", (1, 2, 4))], [("video", (2, 2, 2))], [("image", (1, 4, 2)), ("image", (1, 2, 2))]]


def _steps(seed: int) -> list[list[Batch]]:
    rng = np.random.default_rng(seed)
    steps = []
    for step in range(STEPS):
        batches = []
        for rank in range(RANKS):
            groups = [
                [
                    media_sample(rng, f"vl/{step}-{rank}-{m}-{j}", KINDS[int(rng.integers(len(KINDS)))], encoding=enc)
                    for j, enc in enumerate(rng.choice(["raw", "jpeg"], int(rng.integers(0, 4))).tolist())
                ]
                for m in range(MICRO_BATCHES)
            ]
            batches.append(
                Batch.from_samples(
                    step=step,
                    rank=rank,
                    ranks=RANKS,
                    capacity=400,
                    micro_batches=groups,
                    with_media=True,
                    patches_per_micro_batch=200,
                )
            )
        steps.append(batches)
    return steps


def _fingerprint(micro_batch: dict) -> tuple:
    tensors = tuple(v.numpy().tobytes() for v in micro_batch.values() if isinstance(v, torch.Tensor))
    return (
        micro_batch["step"],
        micro_batch["micro_batch"],
        tuple(micro_batch["sample_ids"]),
        tuple(micro_batch),
        *tensors,
    )


@pytest.fixture(scope="module")
def media_job(kafka_bootstrap: str) -> tuple[str, list[list[Batch]]]:
    job = f"sink-media-{random.Random().getrandbits(32):08x}"
    batches = _steps(5)
    write_steps(kafka_bootstrap, job, batches, aborted_every=2)
    return job, batches


@pytest.mark.kafka
@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_each_micro_batch_carries_its_vision_inputs_decoded_off_the_trainers_thread(
    kafka_bootstrap: str, media_job: tuple[str, list[list[Batch]]], layout: Layout, monkeypatch
) -> None:
    job, batches = media_job
    decoding_threads: set[int] = set()
    patchify = trainer_sink.vlm.qwen2_vl.patchify

    def noting_the_thread(*args, **kwargs):
        decoding_threads.add(threading.get_ident())
        return patchify(*args, **kwargs)

    monkeypatch.setattr(trainer_sink.vlm.qwen2_vl, "patchify", noting_the_thread)
    dataset = KafkaBatchDataset(
        job=job, bootstrap_servers=kafka_bootstrap, rank=1, read=ReadOptions(layout=layout, wait_timeout_s=30)
    )
    got = [_fingerprint(mb) for mb in dataset]
    assert decoding_threads and threading.get_ident() not in decoding_threads
    expected = [_fingerprint(mb) for step in batches for mb in micro_batch_tensors(step[1], layout)]
    assert got == expected
    assert {"pixel_values", "image_grid_thw", "mrope_position_ids", "mm_token_type_ids"} <= set(got[0][3])


def _take(iterator: Iterator[dict], n: int) -> list[tuple]:
    return [_fingerprint(mb) for mb in itertools.islice(iterator, n)]


@pytest.mark.kafka
def test_resuming_yields_exactly_what_followed(kafka_bootstrap: str, media_job: tuple[str, list[list[Batch]]]) -> None:
    job, _ = media_job

    def dataset() -> KafkaBatchDataset:
        return KafkaBatchDataset(
            job=job, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30, prefetch_bytes=1)
        )

    reference = [_fingerprint(mb) for mb in dataset()]
    assert len(reference) == STEPS * MICRO_BATCHES
    for point in (1, MICRO_BATCHES + 1, len(reference) - 1):
        first = dataset()
        iterator = iter(first)
        head = _take(iterator, point)
        state = first.state_dict()
        iterator.close()
        second = dataset()
        second.load_state_dict(state)
        assert head + [_fingerprint(mb) for mb in second] == reference, point


@pytest.mark.kafka
def test_a_frame_that_does_not_decode_names_its_step_and_topic(kafka_bootstrap: str, unique_name: str) -> None:
    rng = np.random.default_rng(1)
    sample = media_sample(rng, "vl/0", [("image", (1, 2, 2))], encoding="jpeg")
    broken = dataclasses.replace(sample.media[0], frames=(sample.media[0].frames[0][:40],))
    batch = Batch.from_samples(
        step=0, rank=0, ranks=1, capacity=99, micro_batches=[[dataclasses.replace(sample, media=(broken,))]],
        with_media=True,
    )  # fmt: skip
    write_steps(kafka_bootstrap, unique_name, [[batch]])
    dataset = KafkaBatchDataset(
        job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, read=ReadOptions(wait_timeout_s=30)
    )
    with pytest.raises(
        DecodeError, match=rf"topic={unique_name}\.rank\.0.*step 0: jpeg frame 0 of a image does not decode"
    ):
        next(iter(dataset))
