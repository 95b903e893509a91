"""A multimodal source in the spec: its vision section, its media fields, and the readers that take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.spec import load_spec
from tests.test_spec import _base, _problems, _write

VISION = {"image_token_id": 10, "video_token_id": 11, "vision_start_id": 12, "vision_end_id": 13}


def _with_source(**source: object) -> dict:
    spec = _base()
    spec["sources"][0] = {"name": "a", "reader": "jsonl", "path": "data/a", **source}
    return spec


def test_a_multimodal_source_loads_with_defaults(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, _with_source(vision=VISION, media_fields={"text": ["caption", "text"]})))
    source = spec.source("a")
    assert source.multimodal and source.field is None
    assert source.vision.encoding == "jpeg" and source.vision.patch_size == 14
    assert source.media_fields.given() == {"text": ("caption", "text")}


def test_webdataset_shards_are_multimodal(tmp_path: Path) -> None:
    spec = _base()
    spec["sources"][0] = {"name": "a", "reader": "webdataset", "path": "data/a", "vision": VISION}
    assert load_spec(_write(tmp_path, spec)).source("a").glob == "**/*.tar"
    del spec["sources"][0]["vision"]
    assert any("webdataset reader reads media" in p for p in _problems(tmp_path, spec))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"vision": VISION, "field": "text"}, "sources[0].field: a multimodal source names its text column"),
        ({"vision": VISION, "pretokenized": True}, "sources[0].pretokenized: a multimodal source tokenizes"),
        ({"media_fields": {"image": "img"}}, "sources[0].media_fields: only a multimodal source"),
        ({"vision": {**VISION, "video_token_id": 10}}, "the four vision token ids must differ"),
        ({"vision": {**VISION, "max_pixels": 100, "min_pixels": 50}}, "must hold one (patch_size * merge_size)^2"),
        ({"vision": {**VISION, "min_pixels": 2 * 10**6}}, "max_pixels: must be at least min_pixels"),
        ({"vision": {**VISION, "video_max_frames": 1}}, "video_max_frames: must be at least temporal_patch_size"),
        ({"vision": {**VISION, "encoding": "webp"}}, "sources[0].vision.encoding"),
        ({"vision": {**VISION, "resolution": 3}}, "sources[0].vision.resolution"),
    ],
)
def test_mistakes_in_a_multimodal_source_name_their_field(tmp_path: Path, source: dict, expected: str) -> None:
    assert any(expected in p for p in _problems(tmp_path, _with_source(**source)))


def test_the_text_reader_reads_no_media(tmp_path: Path) -> None:
    spec = _base()
    spec["sources"][1]["vision"] = VISION
    assert any("the text reader reads no media" in p for p in _problems(tmp_path, spec))
