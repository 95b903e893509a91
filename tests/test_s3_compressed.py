"""Compressed sources in a bucket (a real S3 server, versitygw): objects named ``.gz``/``.zst`` and objects
stored with ``Content-Encoding: gzip`` under a plain name read as the same files on disk, a unit of a member
by ranged GETs from that member on, with no request more than a plain object takes; broken ones as on disk."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import JsonlReader, Reader, make_reader
from connectors.readers.jsonl import LISTING_ONLY_BYTES
from connectors.storage import StoredBytes, storage_for
from connectors.work_units import WorkUnit
from tests.compression_support import (
    EXTENSIONS,
    FORMS,
    codec_of_form,
    compress,
    corpora,
    corrupt,
    cut_points,
    read_units,
    units_of,
)
from tests.s3_support import BUCKET, S3Server, running_server, upload


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


def remote(server: S3Server, root: str, file_format: str = "jsonl", glob: str | None = None) -> Reader:
    return make_reader(file_format, "web", root, glob, storage=storage_for(root, server.settings()))


def put(server: S3Server, key: str, body: bytes, **extra: str) -> None:
    client = storage_for(f"s3://{BUCKET}", server.settings()).client  # type: ignore[attr-defined]
    server.bucket()
    client.put_object(Bucket=BUCKET, Key=key, Body=body, **extra)


def unpinned(unit: WorkUnit) -> WorkUnit:
    return dataclasses.replace(unit, etag="", object_size=0)


def big_corpus(rows: int = 6_000, seed: int = 7) -> bytes:
    """About 2 MB of JSON lines of random words: over ``LISTING_ONLY_BYTES`` once compressed."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ", dtype=np.uint8)
    lines = []
    for row in range(rows):
        text = bytes(rng.choice(letters, int(rng.integers(50, 650)))).decode()
        lines.append(json.dumps({"text": f"row {row} {text}"}).encode() + b"\n")
    return b"".join(lines)


def bgzip_like(data: bytes, member_bytes: int = 65_536) -> bytes:
    """Gzip members of ``member_bytes`` of data each, cut wherever the count falls (as bgzip cuts)."""
    return b"".join(gzip.compress(data[i : i + member_bytes], mtime=0) for i in range(0, len(data), member_bytes))


@settings(
    deadline=None,
    max_examples=8,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # each example uploads files: no shrinking
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=corpora(),
    form=st.sampled_from(FORMS),
    fractions=st.lists(st.floats(0, 1), max_size=5),
    how=st.sampled_from(["intact", "intact", "cut", "bad-frame"]),
)
def test_small_compressed_objects_read_as_the_same_files_on_disk(
    server: S3Server, tmp_path_factory: pytest.TempPathFactory, data: bytes, form: str, fractions: list[float], how: str
) -> None:
    folder = tmp_path_factory.mktemp("local")
    name = f"rows.jsonl{EXTENSIONS[codec_of_form(form)]}"
    stored = compress(data, form, cut_points(data, fractions, aligned=False))
    if how != "intact" and data:
        stored = corrupt(stored, form, how)
    (folder / name).write_bytes(stored)
    root = upload(server, folder, folder.name)
    local, bucket = JsonlReader("web", folder), remote(server, root)
    assert bucket.files() == local.files() == [name]
    bucket_units = units_of(bucket, 1 << 30)
    assert [u.kind for u in bucket_units] == (["file"] if stored else [])  # planned from the listing
    assert read_units(bucket, bucket_units, name) == read_units(local, units_of(local, 1 << 30), name)


def ranges_read(reader: Reader) -> list[tuple[int, int]]:
    """The (start, stop) of every GET the reader's storage makes from now on."""
    storage = reader.storage
    made: list[tuple[int, int]] = []
    read_stored = storage.read_stored

    def counted(path: str, start: int, stop: int, etag: str = "") -> StoredBytes:
        made.append((start, stop))
        return read_stored(path, start, stop, etag)

    storage.read_stored = counted  # type: ignore[method-assign]
    return made


@pytest.mark.parametrize("stored_as", ["name", "content-encoding"])
def test_a_large_gzip_object_of_many_members_is_split_and_each_unit_reads_from_its_member(
    server: S3Server, tmp_path: Path, stored_as: str
) -> None:
    """A bgzip-like object over the listing-only size, named ``.jsonl.gz`` or stored as ``rows.jsonl`` with
    ``Content-Encoding: gzip``: the units of the same file on disk, each reading by ranges from its member on."""
    data = big_corpus()
    body = bgzip_like(data)
    assert len(body) > LISTING_ONLY_BYTES
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rows.jsonl").write_bytes(data)
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "rows.jsonl.gz").write_bytes(body)
    prefix = f"big-{stored_as}"
    key = "rows.jsonl.gz" if stored_as == "name" else "rows.jsonl"
    put(server, f"{prefix}/{key}", body, **({"ContentEncoding": "gzip"} if stored_as != "name" else {}))
    bucket = remote(server, f"s3://{BUCKET}/{prefix}")
    units = units_of(bucket, 200_000)
    local_units = units_of(JsonlReader("web", tmp_path / "packed"), 200_000)
    assert len(units) > 5
    assert [dataclasses.replace(unpinned(u), path="rows.jsonl.gz") for u in units] == local_units
    made = ranges_read(bucket)
    got = []
    for unit in units:
        made.clear()
        got += read_units(bucket, [unit], key, build=False).items
        assert made and min(start for start, _ in made) == unit.byte_offset  # nothing before its member
    plain = JsonlReader("web", tmp_path / "plain")
    assert got == read_units(plain, units_of(plain, 1 << 30), "rows.jsonl", build=False).items


def test_small_objects_stored_with_content_encoding_gzip_read_as_plain_with_one_get_each(
    server: S3Server, tmp_path: Path
) -> None:
    rows = b"".join(json.dumps({"text": f"line {r} é"}).encode() + b"\n" for r in range(300))
    text = "a text document, whole\n" * 40
    put(server, "encoded/rows.jsonl", gzip.compress(rows), ContentEncoding="gzip")
    put(server, "encoded/doc.txt", gzip.compress(text.encode()), ContentEncoding="gzip")
    put(server, "plain/rows.jsonl", rows)
    put(server, "plain/doc.txt", text.encode())
    for file_format, name in (("jsonl", "rows.jsonl"), ("text", "doc.txt")):
        encoded, plain = (
            remote(server, f"s3://{BUCKET}/encoded", file_format),
            remote(server, f"s3://{BUCKET}/plain", file_format),
        )
        encoded_units, plain_units = units_of(encoded, 1 << 30), units_of(plain, 1 << 30)
        encoded_gets, plain_gets = ranges_read(encoded), ranges_read(plain)
        assert read_units(encoded, encoded_units, name) == read_units(plain, plain_units, name)
        assert len(encoded_gets) == len(plain_gets) == 1


def test_a_broken_large_object_reads_as_the_same_file_on_disk(server: S3Server, tmp_path: Path) -> None:
    """Its last member broken: every unit before it whole, then one letter, as on disk."""
    body = corrupt(bgzip_like(big_corpus(seed=11)), "gzip-members", "bad-frame")
    (tmp_path / "rows.jsonl.gz").write_bytes(body)
    put(server, "broken/rows.jsonl", body, ContentEncoding="gzip")
    bucket, local = remote(server, f"s3://{BUCKET}/broken"), JsonlReader("web", tmp_path)
    got = read_units(bucket, units_of(bucket, 300_000), "rows.jsonl", build=False).items
    assert got == read_units(local, units_of(local, 300_000), "rows.jsonl.gz", build=False).items
    letters = [item for item in got if item[0] == "dead"]
    assert len(letters) == 1 and "cannot decompress: gzip member at byte" in str(letters[0][2])
    assert got[-1] == letters[0] and len(got) > 5_000


def test_default_globs_list_the_compressed_objects_as_on_disk(server: S3Server, tmp_path: Path) -> None:
    names = ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d/e.jsonl.zstd", "f.jsonl.bak", "g.json.gz", "i.txt.zst"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    root = upload(server, tmp_path, "globs")
    for file_format in ("jsonl", "text"):
        assert remote(server, root, file_format).files() == make_reader(file_format, "web", tmp_path).files()
    assert remote(server, root, "jsonl").files() == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d/e.jsonl.zstd"]
    assert split_file("web", remote(server, root, "text").layouts()[0], 1)[0].path == "i.txt.zst"
