"""benchmarks/media_throughput_bench.py: its synthetic media are valid samples in the loaders' format, with Qwen2-VL
grids; and a tiny run against the real broker prints the table with both arms and removes its data job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import _media_data as media
from benchmarks import media_throughput_bench as bench
from pipeline.planning.shape import StepShape
from topics.formats.sample_codec import decode_sample, encode_sample

REPO = Path(__file__).resolve().parent.parent


@settings(max_examples=40, deadline=None)
@given(megapixels=st.floats(0.01, 8.0), aspect=st.sampled_from(media.ASPECTS))
def test_sizes_are_smart_resized_to_whole_merged_patches(megapixels: float, aspect: float) -> None:
    height, width = media.smart_size(megapixels, aspect)
    factor = media.PATCH * media.MERGE
    assert height % factor == 0 and width % factor == 0
    assert abs(height * width / (megapixels * 1e6) - 1) < 0.35 + factor**2 / (megapixels * 1e6)


@settings(max_examples=6, deadline=None)
@given(megapixels=st.sampled_from([0.01, 0.03, 0.08]), seed=st.integers(0, 2**16), count=st.integers(1, 30))
def test_media_samples_decode_with_their_grids_and_placeholders(megapixels: float, seed: int, count: int) -> None:
    rng = np.random.default_rng(seed)
    bases = media.base_pictures()
    for items in (media.image_items(rng, bases, megapixels), media.clip_items(rng, bases)[:2]):
        placeholder = media.VISION_IDS["image_token_id" if items[0].kind == "image" else "video_token_id"]
        for sample in media.media_samples(rng, "s", items, count):
            decoded = decode_sample(*encode_sample(sample))
            (item,) = decoded.media
            assert item.patches == 4 * item.tokens and item.height == media.PATCH * item.grid_h
            assert item.encoding == "jpeg" and len(item.frames) == (1 if item.kind == "image" else media.CLIP_FRAMES)
            held = decoded.tokens[item.token_offset : item.token_offset + item.tokens]
            assert np.all(held == placeholder) and decoded.tokens[0] == media.VISION_IDS["vision_start_id"]
            assert decoded.length <= media.sample_tokens(item) + media.CAPTION[1] // 2


@pytest.mark.parametrize(("tokens", "window", "fits"), [(10**6, 2, True), (10**6, 16, True), (10**4, 8, False)])
def test_steps_are_what_the_data_fills_beyond_the_window(tokens: int, window: float, fits: bool) -> None:
    description = {"sources": {"a": {"tokens": tokens}, "b": {"tokens": 4 * tokens}}}
    shape = StepShape(2, 2, 2048)
    if not fits:
        with pytest.raises(SystemExit, match="write more"):
            bench.steps_filled(description, {"a": 0.5, "b": 0.5}, shape, window)
        return
    steps = bench.steps_filled(description, {"a": 0.5, "b": 0.5}, shape, window)
    assert steps >= 2 and (steps + window + 1) * 0.5 * shape.tokens_per_step * 1.06 <= tokens


def test_a_tiny_run_prints_both_arms_and_removes_its_data(kafka_bootstrap: str) -> None:
    command = [sys.executable, "-m", "benchmarks.media_throughput_bench", "--images", "320", "--megapixels", "0.05"]
    command += ["--shapes", "2x2x2048", "--windows", "2", "--window-mb", "1", "--steps", "3", "--repeats", "1"]
    command += ["--kafka-config", "compression.type=none", "--markdown", "--bootstrap-servers", kafka_bootstrap]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    header = next(line for line in done.stdout.splitlines() if line.startswith("| images"))
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 0.05 MP"))
    cells = dict(zip(re.split(r"\s*\|\s*", header)[1:-1], re.split(r"\s*\|\s*", row)[1:-1], strict=True))
    assert cells["R x M x C"] == "2x2x2048" and cells["window"] == "2" and cells["steps"] == "3"
    assert cells["window MiB"] == "1"
    for arm in ("constructor MB/s", "raw MB/s"):
        assert float(cells[arm].split()[0]) > 0, cells
    # items/s, constructor (raw): the raw arm reads the topics in fetches, not by the mixture's shares, so its
    # steps after the first may hold only clips
    items = [re.fullmatch(r"([\d,]+) \(([\d,]+)\)", cells[f"{kind}/s (raw)"]) for kind in ("images", "clips")]
    counts = [[int(n.replace(",", "")) for n in match.groups()] for match in items]
    assert counts[0][0] > 0 and counts[0][1] + counts[1][1] > 0, counts
    assert float(cells["peak RSS MB"].replace(",", "")) > 0 and float(cells["raw peak RSS MB"].replace(",", "")) > 0
    job = re.search(r"data job (\S+):", done.stdout).group(1)
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
    assert not [t for t in topics if t.startswith(f"{job}.") or t.startswith(f"{job}-")]
