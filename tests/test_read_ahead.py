"""A loader reads the next small units of an object-store source ahead: each unit's items are what reading it
then would give, in order, errors included; large units and local sources are read when their turn comes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.planning import split_file
from connectors.readers import make_reader
from connectors.storage import ObjectRefusedError, storage_for
from pipeline.roles.loader.read_ahead import READ_AHEAD_MAX_BYTES, ReadAhead
from tests.s3_support import S3Server, running_server, upload


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


def write_objects(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        lines = [json.dumps({"text": f"object {i} line {n} " + "w" * (n * 7 % 90)}) for n in range(3 + i % 5)]
        lines.insert(1 + i % 3, "{not json")  # a dead letter among the documents
        (folder / f"doc-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")


def test_units_read_ahead_give_what_reading_them_gives_in_order(server: S3Server, tmp_path: Path) -> None:
    write_objects(tmp_path / "src", 24)
    root = upload(server, tmp_path / "src", tmp_path.name)
    reader = make_reader("jsonl", "web", root, storage=storage_for(root, server.settings()))
    units = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 20)]
    expected = [list(reader.read(u)) for u in units]
    ahead = ReadAhead(reader, units=4)
    try:
        assert ahead.units == 4
        for unit in units:
            ahead.start(unit)
        assert [list(ahead.items(u)) for u in units] == expected
        big = dataclasses.replace(units[0], estimated_bytes=READ_AHEAD_MAX_BYTES + 1)
        ahead.start(big)
        assert not ahead._reading  # read when its turn comes
        assert list(ahead.items(big)) == expected[0]
    finally:
        ahead.close()


def test_an_error_reading_ahead_is_raised_when_the_unit_comes(server: S3Server, tmp_path: Path) -> None:
    write_objects(tmp_path / "src", 2)
    root = upload(server, tmp_path / "src", tmp_path.name)
    reader = make_reader("jsonl", "web", root, storage=storage_for(root, server.settings()))
    (unit, *_) = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 20)]
    changed = dataclasses.replace(unit, etag='"0123456789abcdef0123456789abcdef"')
    ahead = ReadAhead(reader)
    try:
        ahead.start(changed)
        items = list(ahead.items(changed))  # a changed object is a dead letter naming it, as read now
        assert items == list(reader.read(changed)) and items
    finally:
        ahead.close()


def test_a_local_source_reads_nothing_ahead(tmp_path: Path) -> None:
    write_objects(tmp_path / "src", 3)
    reader = make_reader("jsonl", "web", tmp_path / "src")
    ahead = ReadAhead(reader)
    units = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 20)]
    for unit in units:
        ahead.start(unit)
    assert ahead.units == 0 and not ahead._reading
    assert [list(ahead.items(u)) for u in units] == [list(reader.read(u)) for u in units]
    ahead.close()


def test_what_was_read_ahead_and_not_taken_is_forgotten(server: S3Server, tmp_path: Path) -> None:
    write_objects(tmp_path / "src", 6)
    root = upload(server, tmp_path / "src", tmp_path.name)
    reader = make_reader("jsonl", "web", root, storage=storage_for(root, server.settings()))
    units = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 20)]
    ahead = ReadAhead(reader)
    try:
        for unit in units:
            ahead.start(unit)
        ahead.forget()
        assert not ahead._reading
        assert list(ahead.items(units[0])) == list(reader.read(units[0]))  # read again when it comes back
    finally:
        ahead.close()


def test_a_refused_object_is_raised_from_items_as_from_a_read(server: S3Server, tmp_path: Path) -> None:
    write_objects(tmp_path / "src", 2)
    root = upload(server, tmp_path / "src", tmp_path.name)
    settings = dataclasses.replace(server.settings(), stop_on_changed=True)
    reader = make_reader("jsonl", "web", root, storage=storage_for(root, settings))
    (unit, *_) = [u for layout in reader.layouts() for u in split_file("web", layout, 1 << 20)]
    changed = dataclasses.replace(unit, etag='"0123456789abcdef0123456789abcdef"')
    ahead = ReadAhead(reader)
    try:
        ahead.start(changed)
        with pytest.raises(ObjectRefusedError, match="changed"):
            list(ahead.items(changed))
    finally:
        ahead.close()
