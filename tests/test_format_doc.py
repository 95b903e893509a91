"""topics/FORMAT.md is right: its decoding snippet, run as written with only pyarrow and
confluent_kafka, reads what the encoder writes, directly and through the real broker, media included; its
pixel snippet (numpy and Pillow) makes the sink's pixel values bit for bit."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, plan_cp_step
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec.cp_cost import ContextParallelCost
from tests.sink_media_support import media_sample
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch
from topics.formats.loss_spans import LOSS_SPANS_KEY
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.formats.sample_codec import SAMPLE_FINGERPRINT
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from trainer_sink.vlm.qwen2_vl import pack_media

FORMAT_MD = Path(__file__).resolve().parent.parent / "topics" / "FORMAT.md"
TIMEOUT_S = 30.0


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", FORMAT_MD.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == 4, "FORMAT.md should hold four python blocks: decode_cp(), decode(), the consumer, patches()"
    allowed = [{"pyarrow", "numpy"}] + [{"pyarrow", "confluent_kafka"}] * 2 + [{"io", "numpy", "PIL"}]
    for block, modules in zip(blocks, allowed, strict=True):
        imported = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", block, flags=re.MULTILINE)
        assert set(imported) <= modules, imported
    return blocks


def _snippets() -> tuple[str, str]:
    blocks = _blocks()
    return blocks[1], blocks[2]


def _batch() -> Batch:
    groups = [
        [Sample("web/a.jsonl/0", "web", np.array([5, -1, 2**31 - 1], np.int32))],
        [],
        [Sample("code/b/1#2", "code", np.zeros(0, np.int32)), Sample("wéb/ü/3", "web", np.arange(4, dtype=np.int32))],
    ]
    return Batch.from_samples(step=1234, rank=2, ranks=3, capacity=8, micro_batches=groups)


def _assert_matches(decoded: dict, batch: Batch) -> None:
    for name in ("step", "rank", "ranks", "micro_batches", "capacity"):
        assert decoded[name] == getattr(batch, name), name
    assert decoded["sample_id"] == batch.sample_ids
    assert decoded["source"] == batch.sources
    np.testing.assert_array_equal(decoded["micro_batch"], batch.micro_batch)
    np.testing.assert_array_equal(decoded["lengths"], batch.lengths)
    np.testing.assert_array_equal(decoded["tokens"], batch.tokens)
    assert decoded["tokens"].dtype == np.int32


def test_snippet_decodes_an_encoded_batch() -> None:
    decode_block, _ = _snippets()
    namespace: dict = {}
    exec(compile(decode_block, str(FORMAT_MD), "exec"), namespace)
    batch = _batch()
    _, value, headers = encode_batch(batch)
    _assert_matches(namespace["decode"](value, headers), batch)
    empty = Batch.from_samples(step=0, rank=0, ranks=1, capacity=1, micro_batches=[[]])
    _, value, headers = encode_batch(empty)
    assert namespace["decode"](value, headers)["sample_id"] == []


def test_snippet_decodes_the_loss_spans() -> None:
    decode_block, _ = _snippets()
    namespace: dict = {}
    exec(compile(decode_block, str(FORMAT_MD), "exec"), namespace)
    samples = [
        Sample("chat/c.jsonl/0", "chat", np.arange(9, dtype=np.int32), {LOSS_SPANS_KEY: "2:4,6:9"}),
        Sample("chat/c.jsonl/1", "chat", np.arange(3, dtype=np.int32), {LOSS_SPANS_KEY: ""}),
        Sample("web/a.jsonl/0", "web", np.arange(5, dtype=np.int32)),
    ]
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=20, micro_batches=[samples])
    decoded = namespace["decode"](*encode_batch(batch)[1:])
    _assert_matches(decoded, batch)
    assert decoded["loss_spans"] == [[2, 4, 6, 9], [], [0, 5]]
    assert "loss_spans" not in namespace["decode"](*encode_batch(_batch())[1:])


def _media_batch(encoding: str) -> Batch:
    rng = np.random.default_rng(3)
    specs = [[("image", (1, 4, 6))], [], [("video", (2, 2, 4)), ("image", (1, 2, 2))]]
    samples = [media_sample(rng, f"vl/{i}", spec, encoding=encoding) for i, spec in enumerate(specs)]
    return Batch.from_samples(
        step=3, rank=0, ranks=1, capacity=999, micro_batches=[samples[:2], samples[2:]], with_media=True,
        patches_per_micro_batch=40,
    )  # fmt: skip


def test_snippets_decode_a_batch_with_media() -> None:
    _, decode_block, _, pixels_block = _blocks()
    namespace: dict = {}
    exec(compile(decode_block + "\n" + pixels_block, str(FORMAT_MD), "exec"), namespace)
    for encoding in ("raw", "jpeg", "png"):
        batch = _media_batch(encoding)
        _, value, headers = encode_batch(batch)
        decoded = namespace["decode"](value, headers)
        _assert_matches(decoded, batch)
        assert decoded["patches_per_micro_batch"] == 40
        expected = [
            [{**dataclasses.asdict(item), "frames": list(item.frames)} for item in s.media] for s in batch.samples()
        ]
        assert decoded["media"] == expected
        items = [item for row in decoded["media"] for item in row]
        for kind, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
            made = [namespace["patches"](item) for item in items if item["kind"] == kind]
            packed = np.concatenate([getattr(media, key) for media in pack_media(batch)])
            np.testing.assert_array_equal(np.concatenate(made), packed)
    text_only = namespace["decode"](*encode_batch(_batch())[1:])
    assert "media" not in text_only and "patches_per_micro_batch" not in text_only


def test_document_names_what_the_encoder_writes() -> None:
    text = FORMAT_MD.read_text(encoding="utf-8")
    assert SAMPLE_FINGERPRINT.hex() in text
    key, _, headers = encode_batch(_batch())
    for name, _value in [*headers, *encode_batch(_media_batch("raw"))[2]]:
        assert f"`{name}`" in text, name
    assert key == b"1234"


def test_snippet_reads_a_batch_from_kafka(kafka_bootstrap: str, unique_name: str) -> None:
    decode_block, consumer_block = _snippets()
    topic = JobTopics(unique_name).rank(2)
    consumer_block, count = re.subn(
        r"^BOOTSTRAP, TOPIC = .*$",
        f"BOOTSTRAP, TOPIC = {kafka_bootstrap!r}, {topic!r}",
        consumer_block,
        flags=re.MULTILINE,
    )
    assert count == 1, "the consumer snippet should start with 'BOOTSTRAP, TOPIC = ...'"
    batch = _batch()
    try:
        ensure_job_topics(kafka_bootstrap, unique_name, ["web", "code"], 3, timeout_s=TIMEOUT_S)
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        key, value, headers = encode_batch(batch)
        producer.produce(topic, value=value, key=key, headers=headers)
        assert producer.flush(TIMEOUT_S) == 0, "the batch was not delivered in time"
        namespace: dict = {}
        exec(compile(decode_block + "\n" + consumer_block, str(FORMAT_MD), "exec"), namespace)
        _assert_matches(namespace["batch"], batch)
    finally:
        delete_job_topics(kafka_bootstrap, unique_name, timeout_s=TIMEOUT_S)


def test_the_context_parallel_snippet_decodes_a_version_3_batch_and_the_version_1_one_refuses_it() -> None:
    namespace: dict = {}
    cp_block, decode_block = _blocks()[:2]
    exec(compile(cp_block + "\n" + decode_block, str(FORMAT_MD), "exec"), namespace)
    rng = np.random.default_rng(5)
    samples = [Sample(f"s/{i}", "web", rng.integers(0, 9000, n).astype(np.int32)) for i, n in enumerate([9, 3, 30, 4])]
    lengths = np.array([s.length for s in samples])
    plan = plan_cp_step(lengths, CPShape(4, 2, 8, CPMode.ALIGNED, 4), ContextParallelCost())
    assert (plan.cp > 1).any() and plan.placed_mask.all()
    for batch in build_cp_batches(11, plan, samples):
        _, value, headers = encode_batch(batch)
        decoded = namespace["decode_cp"](value, headers)
        for name in ("step", "rank", "ranks", "micro_batches", "max_micro_batches", "capacity", "loss_tokens"):
            assert decoded[name] == getattr(batch, name), name
        assert decoded["mode"] == "aligned" and decoded["sample_id"] == batch.sample_ids
        for name in ("tokens", "labels", "positions"):
            np.testing.assert_array_equal(decoded[name], getattr(batch, name))
        for name, attr in (("micro_batch", "micro_batch"), ("length", "lengths"), ("cp_size", "cp_size")):
            assert decoded[name] == getattr(batch, attr).tolist(), name
        assert decoded["cp_rank"] == batch.cp_rank.tolist()
        np.testing.assert_array_equal(decoded["slice_lengths"], np.diff(batch.offsets))
        with pytest.raises(ValueError, match="unknown batch format version b'3'"):
            namespace["decode"](value, headers)
