"""Work units: their wire form, and planning a source into units of similar cost in a seeded order."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.cost import _FLOOR_SECONDS_PER_BYTE, measure_cost_per_byte, sample_units
from connectors.planning import plan_units, split_file, unit_bytes
from connectors.readers import FileLayout, JsonlReader
from connectors.samples import SampleBuilder
from connectors.seeding import stable_seed
from connectors.work_units import WorkUnit
from topics.errors import DecodeError


def test_unit_json_round_trip_and_id() -> None:
    unit = WorkUnit("code", "a/b.parquet", "row_group", 64, 128, epoch=2, estimated_bytes=999, row_group=1)
    assert WorkUnit.from_json(unit.to_json()) == unit
    assert unit.unit_id == "code/a/b.parquet:row_group=1:64-128@e2"
    assert WorkUnit("t", "x.txt", "file", 0, 1).unit_id == "t/x.txt:file:0-1@e0"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"source": "s", "path": "p", "kind": "file", "start": 0, "stop": 1, "colour": 1}', "unknown fields"),
        (b'{"source": "s", "path": "p", "kind": "file", "start": "0", "stop": 1}', "'start' must be int"),
        (b'{"source": "s", "path": "p", "kind": "file", "start": 2, "stop": 1}', "not a valid range"),
        (b'{"source": "s", "path": "p", "kind": "chunk", "start": 0, "stop": 1}', "not one of"),
        (b'{"source": "s", "path": "p", "kind": "row_group", "start": 0, "stop": 1}', "row_group is set"),
        (b'{"source": "s", "path": "p", "kind": "file"}', "missing"),
    ],
)
def test_bad_unit_messages_are_decode_errors(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        WorkUnit.from_json(data)


def layout(path: str, sizes: list[int], groups: list[int] | None = None) -> FileLayout:
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    row_groups = None if groups is None else np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)
    return FileLayout(path, int(bounds[-1]), bounds, row_groups=row_groups)


class FakeReader(JsonlReader):
    """Planning looks only at layouts; this one makes them up instead of reading files."""

    def __init__(self, layouts: list[FileLayout]) -> None:
        super().__init__("fake", "/nonexistent")
        self._layouts = layouts

    def layouts(self) -> list[FileLayout]:
        return self._layouts


SOURCE = [layout(f"f{i:02d}.jsonl", [100 + 37 * (r % 11) for r in range(40 * (i % 4) + 5)]) for i in range(12)]


def test_planning_is_deterministic_and_shuffled_per_epoch() -> None:
    reader = FakeReader(SOURCE)
    first = plan_units(reader, 1e-6, 2e-3, seed=7)
    assert first == plan_units(reader, 1e-6, 2e-3, seed=7)
    later = plan_units(reader, 1e-6, 2e-3, seed=7, epoch=1)
    other_seed = plan_units(reader, 1e-6, 2e-3, seed=8)
    assert {u.epoch for u in later} == {1}
    assert sorted(u.unit_id.replace("@e1", "@e0") for u in later) == sorted(u.unit_id for u in first)
    assert [u.unit_id for u in later] != [u.unit_id.replace("@e0", "@e1") for u in first]
    assert other_seed != first
    in_file_order = sorted(first, key=lambda u: (u.path, u.start))
    assert first != in_file_order


def test_stable_seed_does_not_depend_on_the_process() -> None:
    # blake2b of the parts; Python's salted hash() would change between runs
    assert stable_seed(0, "code", 1) == [558541908, 2930952701, 1108006172, 3157884244]


def test_heavy_source_gets_more_smaller_units() -> None:
    reader = FakeReader(SOURCE)
    light = plan_units(reader, 1e-7, 2e-3)
    heavy = plan_units(reader, 1e-6, 2e-3)
    assert len(heavy) > len(light)
    assert max(u.estimated_bytes for u in heavy) < max(u.estimated_bytes for u in light)
    assert sum(u.estimated_bytes for u in heavy) == sum(u.estimated_bytes for u in light)


def test_unit_bytes_arguments() -> None:
    assert unit_bytes(1e-6, 1.0) == 1_000_000
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cost_per_byte"):
            unit_bytes(bad, 1.0)
    with pytest.raises(ValueError, match="target_unit_cost"):
        unit_bytes(1e-6, 0.0)


def test_unreadable_and_empty_files() -> None:
    broken = FileLayout.unreadable("bad.parquet", 5000, "cannot open")
    assert split_file("s", broken, 10) == [WorkUnit("s", "bad.parquet", "file", 0, 0, estimated_bytes=5000)]
    assert split_file("s", layout("empty.jsonl", []), 10) == []


@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=80),
    group_rows=st.none() | st.integers(1, 30),
    max_bytes=st.integers(1, 3000),
    epoch=st.integers(0, 3),
)
def test_units_cover_every_row_once(sizes: list[int], group_rows: int | None, max_bytes: int, epoch: int) -> None:
    groups = None
    if group_rows is not None:
        groups = [group_rows] * (len(sizes) // group_rows) + (
            [len(sizes) % group_rows] if len(sizes) % group_rows else []
        )
    file_layout = layout("f.parquet", sizes, groups)
    units = split_file("s", file_layout, max_bytes, epoch)
    assert sorted(units, key=lambda u: u.start) == units
    assert [u.start for u in units] == [0, *[u.stop for u in units[:-1]]]
    assert units[-1].stop == len(sizes)
    assert all(u.epoch == epoch and u.num_rows > 0 for u in units)
    assert sum(u.estimated_bytes for u in units) == sum(sizes)
    allowed = set(file_layout.row_groups.tolist()) if groups else set(range(len(sizes) + 1))
    assert all(u.start in allowed and u.stop in allowed for u in units)
    if len(units) == 1:
        assert units[0].kind == "file"
    for unit in units:
        assert WorkUnit.from_json(unit.to_json()) == unit
        if unit.kind == "row_group":
            assert file_layout.row_groups[unit.row_group] == unit.start
            assert file_layout.row_groups[unit.row_group + 1] == unit.stop
    # each cut moves at most half an allowed interval from its ideal place, so a unit exceeds the
    # ideal size (at most max_bytes) by at most the largest interval between allowed cuts
    largest = int(np.diff(file_layout.row_bounds[sorted(allowed)]).max())
    assert all(u.estimated_bytes <= max_bytes + largest for u in units)


def test_measured_cost_is_positive_and_sample_deterministic(tmp_path: Path) -> None:
    for i in range(5):
        lines = [json.dumps({"ids": list(range(r + 1))}) for r in range(30)]
        (tmp_path / f"{i}.jsonl").write_text("\n".join(lines) + "\n")
    reader = JsonlReader("src", tmp_path, field="ids", content="tokens")
    layouts = reader.layouts()
    picked = sample_units(reader, layouts, sample_bytes=2000, max_files=3)
    assert [u.path for u in picked] == ["0.jsonl", "2.jsonl", "4.jsonl"]
    assert picked == sample_units(reader, layouts, sample_bytes=2000, max_files=3)
    cost = measure_cost_per_byte(reader, SampleBuilder(None, max_length=8), sample_bytes=2000, max_files=3)
    # Measured, not the floor returned when nothing could be sampled (which would pass any `cost > 0`).
    assert cost > _FLOOR_SECONDS_PER_BYTE
    assert plan_units(reader, cost, cost * 500) == plan_units(reader, cost, cost * 500, layouts=layouts)
