"""Bad media end to end: two multimodal sources (WebDataset shards, and JSONL rows naming image and clip files)
hold every kind of bad input among good samples, and real loader processes read them into the real broker. Each
bad one is a dead letter on ``<job>.dlq`` naming its source, where it is and why; every good sample reaches its
source topic exactly once, with its media; the loaders go on to the end. (Each class on its own, without Kafka:
``tests/test_media_decode.py``, ``tests/test_media_readers.py``.)"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.autoscale_support import train_tokenizer
from tests.caption_shards import VISION_SECTION, WORDS, caption_image, write_shard
from tests.loader_support import dead_letters, start_loader, wait_all
from tests.media_support import clip_bytes, image_bytes, png_with_header, text_image, unknown_codec_clip
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end

SHARD_SOURCE, ROWS_SOURCE = "pairs", "rows"


def _corrupt_header(data: bytes) -> bytes:
    return data[:8] + bytes(32) + data[40:]


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


@dataclass
class Layout:
    """What the test wrote: per source, each good sample's id with its media kinds, and each bad input's
    location with a phrase its dead letter's reason must hold."""

    good: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    bad: dict[tuple[str, str], str] = field(default_factory=dict)


def _caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


# -- a WebDataset source: each entry is the members of one key ----------------------------------------------

BAD_MEMBERS: dict[str, tuple[list[tuple[str, bytes]], str, str]] = {
    # name: (members as (extension, bytes), the member a decoding error names or "" for the key, reason)
    "corrupt image": (
        [("png", _corrupt_header(image_bytes(text_image(80, 60))))],
        "png",
        "not an image Pillow can read",
    ),
    "truncated jpeg": ([("jpg", _truncated(image_bytes(text_image(300, 200), "JPEG")))], "jpg", "truncated"),
    "zero-sized header": ([("png", png_with_header(0, 10))], "png", "zero-sized header"),
    "absurd header": ([("png", png_with_header(100_000, 100_000))], "png", "too large to decode safely"),
    "unsupported codec": ([("mkv", unknown_codec_clip())], "mkv", "has no decoder in this FFmpeg build"),
    "not a video": ([("mp4", image_bytes(text_image(64, 48)))], "mp4", "a still image (png_pipe), not a video"),
    "image without its text": ([("jpg", image_bytes(text_image(40, 30), "JPEG"))], "", "no text"),
    "text without its image": ([], "", "no image or video"),
}


def _good_members(key: str, rng: random.Random, kind: str) -> tuple[list[tuple[str, bytes]], tuple[str, ...]]:
    """A good sample's members and its media kinds: a pair, a clip pair, or an interleaved document."""
    caption = _caption(rng)
    if kind == "clip":
        return [(f"{key}.mkv", clip_bytes(6)), (f"{key}.txt", caption.encode())], ("video",)
    extension, image = caption_image(caption, rng)
    if kind == "pair":
        return [(f"{key}.{extension}", image), (f"{key}.txt", caption.encode())], ("image",)
    segments = [{"text": caption}, {"image": f"1.{extension}"}, {"text": _caption(rng)}, {"image": "2.png"}]
    members = [
        (f"{key}.1.{extension}", image),
        (f"{key}.2.png", image_bytes(text_image(50, 40, _caption(rng)))),
        (f"{key}.json", json.dumps({"segments": segments}).encode()),
    ]
    return members, ("image", "image")


def write_shards(root: Path, rng: random.Random, layout: Layout) -> None:
    """Two shards holding every bad kind once among good samples, in a random order."""
    entries = [("bad", name) for name in BAD_MEMBERS] + [("good", kind) for kind in ["pair"] * 8 + ["clip", "doc"] * 2]
    rng.shuffle(entries)
    good = layout.good.setdefault(SHARD_SOURCE, {})
    half = len(entries) // 2
    for shard, part in enumerate((entries[:half], entries[half:])):
        path = f"pairs-{shard}.tar"
        members: list[tuple[str, bytes]] = []
        for row, (what, name) in enumerate(part):
            key = f"{shard}-{row:03d}"
            if what == "good":
                found, kinds = _good_members(key, rng, name)
                members += found
                good[f"{SHARD_SOURCE}/{path}/{row}"] = kinds
                continue
            bad, named, reason = BAD_MEMBERS[name]
            members += [(f"{key}.{extension}", data) for extension, data in bad]
            if name != "image without its text":
                members.append((f"{key}.txt", _caption(rng).encode()))
            layout.bad[(SHARD_SOURCE, f"{path}:key={key}" + (f".{named}" if named else ""))] = reason
        write_shard(root / path, members)


# -- a JSONL source: rows naming files under its root -------------------------------------------------------

BAD_ROWS: dict[str, tuple[str, str]] = {
    # name: (the row's location after "<file>:row=<n>", reason)
    "missing image file": (":image=0", "does not exist under the source root"),
    "missing clip file": (":video=0", "does not exist under the source root"),
    "not a video file": (":video=0", "not a video FFmpeg can read"),
    "segment of two": ("", "segment 1 must hold exactly one of text, image and video"),
    "segments not a list": ("", "segments is str"),
    "segment a number": ("", "segment 2 is int"),
    "truncated line": ("", "invalid JSON"),
}


def _bad_row(name: str, row: int) -> str:
    return {
        "missing image file": json.dumps({"image": f"images/gone-{row}.png", "text": "lost"}),
        "missing clip file": json.dumps({"video": f"videos/gone-{row}.mkv", "text": "lost"}),
        "not a video file": json.dumps({"video": "videos/notes.mp4", "text": "words, not frames"}),
        "segment of two": json.dumps({"segments": ["a", {"text": "b", "image": "images/g-0.png"}]}),
        "segments not a list": json.dumps({"segments": "a caption"}),
        "segment a number": json.dumps({"segments": ["a", {"image": "images/g-0.png"}, 7]}),
        "truncated line": '{"segments": [{"text": "cut"}, {"image": ',
    }[name]


def write_rows(root: Path, rng: random.Random, layout: Layout) -> None:
    """Two JSONL files holding every bad kind of row once among good rows (pairs, clips, interleaved)."""
    (root / "images").mkdir(parents=True)
    (root / "videos").mkdir()
    (root / "videos" / "notes.mp4").write_text("a text file named like a clip\n")
    (root / "videos" / "clip.mkv").write_bytes(clip_bytes(8))
    entries = [("bad", name) for name in BAD_ROWS] + [("good", kind) for kind in ["pair"] * 6 + ["clip", "doc"] * 2]
    rng.shuffle(entries)
    good = layout.good.setdefault(ROWS_SOURCE, {})
    half = len(entries) // 2
    for number, part in enumerate((entries[:half], entries[half:])):
        path = f"rows-{number}.jsonl"
        lines = []
        for row, (what, name) in enumerate(part):
            if what == "bad":
                lines.append(_bad_row(name, row))
                where, reason = BAD_ROWS[name]
                layout.bad[(ROWS_SOURCE, f"{path}:row={row}{where}")] = reason
                continue
            extension, image = caption_image(_caption(rng), rng)
            image_path = f"images/g-{number}-{row}.{extension}"
            (root / image_path).write_bytes(image)
            if name == "pair":
                record, kinds = {"image": image_path, "text": _caption(rng)}, ("image",)
            elif name == "clip":
                record, kinds = {"video": "videos/clip.mkv", "caption": _caption(rng)}, ("video",)
            else:
                record = {
                    "segments": [_caption(rng), {"image": image_path}, {"text": "and"}, {"video": "videos/clip.mkv"}]
                }
                kinds = ("image", "video")
            lines.append(json.dumps(record))
            good[f"{ROWS_SOURCE}/{path}/{row}"] = kinds
        (root / path).write_text("\n".join(lines) + "\n")
    (root / "images" / "g-0.png").write_bytes(image_bytes(text_image(30, 30)))  # named by bad rows only


def write_job(folder: Path, job: str, bootstrap: str, seed: int) -> tuple[Path, Layout]:
    """The two sources, each bad input and good sample at a place that ``seed`` draws; the spec."""
    rng = random.Random(seed)
    layout = Layout()
    write_shards(folder / SHARD_SOURCE, rng, layout)
    write_rows(folder / ROWS_SOURCE, rng, layout)
    train_tokenizer([" ".join(WORDS)] * 50, 300, folder / "tokenizer.json")
    vision = {**VISION_SECTION, "video_min_pixels": 28 * 28, "video_max_pixels": 28 * 28 * 4, "video_max_frames": 4}
    source = {"max_sample_length": 512, "eod_token_id": 0, "vision": vision}
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(folder / "tokenizer.json"),
        "sources": [
            {"name": SHARD_SOURCE, "reader": "webdataset", "path": str(folder / SHARD_SOURCE), **source},
            {"name": ROWS_SOURCE, "reader": "jsonl", "path": str(folder / ROWS_SOURCE), **source},
        ],
        "mixture": {"weights": {SHARD_SOURCE: 1, ROWS_SOURCE: 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 512, "patches_per_micro_batch": 256},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 3,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, layout


@pytest.mark.kafka
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_bad_input_is_a_dead_letter_and_every_good_sample_arrives_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, seed: int
) -> None:
    spec, layout = write_job(tmp_path / "data", unique_name, kafka_bootstrap, seed)
    loaders = [start_loader(spec, source, 0, tmp_path) for source in (SHARD_SOURCE, ROWS_SOURCE)]
    wait_all(loaders, timeout_s=240, log_dir=tmp_path)  # each exits 0: bad input stops no loader

    topics = JobTopics(unique_name)
    letters = dead_letters(kafka_bootstrap, topics)
    where = Counter((letter.source, letter.location) for letter in letters)
    assert set(where) == set(layout.bad), (
        f"dead letters not expected: {sorted(set(where) - set(layout.bad))}; "
        f"bad inputs without one: {sorted(set(layout.bad) - set(where))}"
    )
    assert [key for key, n in where.items() if n > 1] == [], "a bad input dead-lettered more than once"
    for letter in letters:
        assert layout.bad[(letter.source, letter.location)] in letter.reason, (letter.location, letter.reason)

    for source, good in layout.good.items():
        records = read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.src(source), timeout_s=60)
        samples = [decode_sample_message(record) for record in records]
        counts = Counter(sample.sample_id for sample in samples)
        assert set(counts) == set(good), (
            f"{source}: missing {sorted(set(good) - set(counts))}, not expected {sorted(set(counts) - set(good))}"
        )
        assert [i for i, n in counts.items() if n > 1] == [], f"{source}: samples written more than once"
        for sample in samples:
            assert tuple(item.kind for item in sample.media) == good[sample.sample_id], sample.sample_id
            assert sample.patches > 0 and all(item.frames for item in sample.media), sample.sample_id

    summaries = [json.loads(p.read_text().strip().splitlines()[-1]) for p in sorted(tmp_path.glob("loader-*.log"))]
    assert sorted(s["dead_letters"] for s in summaries) == sorted(
        sum(source == name for source, _ in layout.bad) for name in (SHARD_SOURCE, ROWS_SOURCE)
    ), summaries
