"""Readers over a real S3 server (versitygw): the same units and documents as from the same files on a local
disk, for every format; changed and vanished objects refused as dead letters naming bucket, key and reason."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import Document, Reader, make_reader
from connectors.readers.jsonl import lines
from connectors.storage import storage_for
from connectors.work_units import WorkUnit
from tests.s3_support import S3Server, running_server, upload
from topics.formats.dead_letter import DeadLetter

FORMATS = ("jsonl", "parquet", "arrow", "text")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


def write_source(folder: Path, file_format: str, sizes: list[int]) -> None:
    """One file per entry of ``sizes`` with that many rows (Parquet in row groups of 7), in a subfolder too."""
    for i, rows in enumerate(sizes):
        texts = [f"file {i} row {r} " + "x" * ((r * 37 + i) % 300) for r in range(rows)]
        path = folder / ("sub" if i % 2 else "") / f"part-{i}.{ {'text': 'txt'}.get(file_format, file_format) }"
        path.parent.mkdir(parents=True, exist_ok=True)
        if file_format == "jsonl":
            path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        elif file_format == "parquet":
            pq.write_table(pa.table({"text": texts}), path, row_group_size=7)
        elif file_format == "arrow":
            feather.write_feather(pa.table({"text": texts}), path, chunksize=5)
        else:
            path.write_text("\n".join(texts))


def units_of(reader: Reader, max_bytes: int) -> list[WorkUnit]:
    return [unit for layout in reader.layouts() for unit in split_file(reader.source, layout, max_bytes)]


def documents(reader: Reader, units: list[WorkUnit]) -> list[tuple[str, str | None]]:
    out = []
    for unit in units:
        for item in reader.read(unit):
            assert isinstance(item, Document), f"{unit.unit_id}: {item}"
            out.append((item.document_id, item.text))
    return out


def unpinned(unit: WorkUnit) -> WorkUnit:
    return dataclasses.replace(unit, etag="", object_size=0)


@settings(
    deadline=None,
    max_examples=8,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # each example uploads files: no shrinking
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    file_format=st.sampled_from(FORMATS),
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    max_bytes=st.sampled_from([300, 2_000, 1 << 30]),
)
def test_same_units_and_documents_as_local_disk(
    server: S3Server, tmp_path_factory: pytest.TempPathFactory, file_format: str, sizes: list[int], max_bytes: int
) -> None:
    folder = tmp_path_factory.mktemp("local")
    write_source(folder, file_format, sizes)
    root = upload(server, folder, folder.name)
    local = make_reader(file_format, "web", folder)
    remote = make_reader(file_format, "web", root, storage=storage_for(root, server.settings()))
    assert remote.files() == local.files()
    local_units, remote_units = units_of(local, max_bytes), units_of(remote, max_bytes)
    if file_format != "jsonl" or max_bytes == 1 << 30:  # small JSONL objects are planned whole from the listing
        assert [unpinned(u) for u in remote_units] == local_units
    assert all(u.etag and u.object_size for u in remote_units)
    assert documents(remote, remote_units) == documents(local, local_units)


def test_large_jsonl_object_is_read_by_byte_ranges(server: S3Server, tmp_path: Path) -> None:
    """A JSONL object over the listing-only size gets its lines' layout, and each unit reads its byte range."""
    folder = tmp_path / "big"
    folder.mkdir()
    lines = [json.dumps({"text": f"row {r} " + "y" * (r % 500)}) + "\n" for r in range(6_000)]
    (folder / "big.jsonl").write_text("".join(lines))
    root = upload(server, folder, "big")
    local = make_reader("jsonl", "web", folder)
    remote = make_reader("jsonl", "web", root, storage=storage_for(root, server.settings()))
    remote_units = units_of(remote, 100_000)
    assert len(remote_units) > 10
    assert [unpinned(u) for u in remote_units] == units_of(local, 100_000)
    assert documents(remote, remote_units) == documents(local, units_of(local, 100_000))


def planned(server: S3Server, tmp_path: Path, file_format: str) -> tuple[Reader, list[WorkUnit], str]:
    folder = tmp_path / "src"
    write_source(folder, file_format, [30, 30])
    root = upload(server, folder, f"{tmp_path.name}-{file_format}")
    reader = make_reader(file_format, "web", root, storage=storage_for(root, server.settings()))
    return reader, units_of(reader, 1 << 30), root


def letters(reader: Reader, unit: WorkUnit) -> list[DeadLetter]:
    items = list(reader.read(unit))
    assert all(isinstance(i, DeadLetter) for i in items), items
    return items  # type: ignore[return-value]


@pytest.mark.parametrize("file_format", FORMATS)
def test_changed_object_is_refused_as_a_dead_letter(server: S3Server, tmp_path: Path, file_format: str) -> None:
    reader, units, root = planned(server, tmp_path, file_format)
    unit = units[0]
    key = f"{root.removeprefix('s3://corpus/')}/{unit.path}"
    storage = storage_for(root, server.settings())
    storage.client.put_object(Bucket="corpus", Key=key, Body=b"overwritten after planning\n")  # type: ignore[attr-defined]
    [letter] = letters(reader, unit)
    assert f"{root}/{unit.path}" in letter.reason
    assert "changed since planning" in letter.reason and unit.etag in letter.reason
    assert letter.source == "web" and letter.location == unit.path


@pytest.mark.parametrize("file_format", FORMATS)
def test_vanished_object_is_refused_as_a_dead_letter(server: S3Server, tmp_path: Path, file_format: str) -> None:
    reader, units, root = planned(server, tmp_path, file_format)
    unit = units[-1]
    storage = storage_for(root, server.settings())
    storage.client.delete_object(Bucket="corpus", Key=f"{root.removeprefix('s3://corpus/')}/{unit.path}")  # type: ignore[attr-defined]
    [letter] = letters(reader, unit)
    assert f"{root}/{unit.path}: no such object (404" in letter.reason and "vanished since planning" in letter.reason


def test_unchanged_objects_beside_a_changed_one_are_read(server: S3Server, tmp_path: Path) -> None:
    reader, units, root = planned(server, tmp_path, "parquet")
    storage = storage_for(root, server.settings())
    changed = units[0].path
    storage.client.put_object(Bucket="corpus", Key=f"{root.removeprefix('s3://corpus/')}/{changed}", Body=b"x")  # type: ignore[attr-defined]
    for unit in units:
        items = list(reader.read(unit))
        if unit.path == changed:
            assert [type(i) for i in items] == [DeadLetter]
        else:
            assert items and all(isinstance(i, Document) for i in items)
    assert np.all([u.etag for u in units])


@settings(deadline=None, max_examples=300)
@given(
    data=st.binary(max_size=300).map(lambda b: b.replace(b"a", b"\n")),
    chunk=st.integers(1, 64),
    skip=st.integers(0, 5),
)
def test_lines_are_what_readline_gives(data: bytes, chunk: int, skip: int) -> None:
    """The JSONL reader's chunked lines (one request a chunk from a store) are readline's, from any position."""
    expected = io.BytesIO(data)
    for _ in range(skip):
        expected.readline()
    got = io.BytesIO(data)
    for _ in range(skip):
        got.readline()
    assert list(lines(got, chunk)) == list(iter(expected.readline, b""))


def test_a_prefix_of_many_small_objects_is_planned_from_its_paginated_listing_alone(server: S3Server) -> None:
    """2,500 objects (three pages of a listing): one pinned whole-object unit each, and no object read."""
    folder = server.bucket() / "many"
    for i in range(2_500):
        body = (json.dumps({"text": f"object {i}"}) + "\n").encode()
        path = folder / f"{i % 7}" / f"obj-{i:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        os.setxattr(path, "user.etag", f'"{hashlib.md5(body).hexdigest()}"'.encode())  # as a PUT leaves it
    storage = storage_for("s3://corpus/many", server.settings())

    def no_reads(*args: object, **kwargs: object) -> bytes:
        raise AssertionError(f"planning read an object: {args}")

    storage.read_range = storage.read_stored = no_reads  # type: ignore[method-assign]
    reader = make_reader("jsonl", "many", "s3://corpus/many", storage=storage)
    units = units_of(reader, 1 << 20)
    assert len(units) == 2_500 and {u.kind for u in units} == {"file"}
    assert sorted(u.path for u in units) == sorted(f"{i % 7}/obj-{i:05d}.jsonl" for i in range(2_500))
    assert all(u.etag.startswith('"') and u.object_size > 0 for u in units)


def test_a_sharded_prefix_lists_as_the_same_folder_on_disk(server: S3Server) -> None:
    """Objects beside sub-folders (a page and more of them), folders nested and named alike: the listing that
    fans out over sub-folders finds what a walk of the gateway's own folder finds, sorted."""
    folder = server.bucket() / "sharded"
    keys = [f"top-{i:04d}.jsonl" for i in range(1_100)]
    keys += [f"a/b/c/deep-{i}.jsonl" for i in range(3)] + ["a/x.jsonl", "ab/y.jsonl", "a.b/z.jsonl"]
    keys += [f"shard-{s}/part-{i:04d}.jsonl" for s in range(3) for i in range(1_050 if s == 0 else 5)]
    for key in keys:
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(key.encode())
    (folder / "empty").mkdir()
    listed = storage_for("s3://corpus/sharded", server.settings()).list()
    assert [(o.path, o.size) for o in listed] == [(o.path, o.size) for o in storage_for(str(folder)).list()]
    assert sorted(keys) == [o.path for o in listed]
