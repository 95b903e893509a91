"""Multimodal readers: WebDataset shards, Parquet and JSONL written with random interleavings of text, images and
clips read back part for part; shards split at random samples; each kind of bad input a dead letter."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from connectors.planning import split_file, split_unit
from connectors.readers import (
    ArrowReader,
    Document,
    JsonlReader,
    MediaFields,
    MediaRef,
    ParquetReader,
    Reader,
    TextReader,
    WebDatasetReader,
    make_reader,
)
from connectors.readers._tar_members import TarShard
from connectors.work_units import WorkUnit
from topics.formats.dead_letter import DeadLetter

REPO = Path(__file__).resolve().parent.parent
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
TAR_FORMATS = ("USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT")

# A medium in a test document: (kind, bytes for a file in the data, or a path for JSONL).
Medium = tuple[str, bytes | str]
TestPart = str | Medium


@contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def pillow_bytes(width: int, height: int, fmt: str, shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, shade // 2)).save(out, format=fmt)
    return out.getvalue()


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24)
images = st.builds(
    pillow_bytes, st.integers(1, 12), st.integers(1, 12), st.sampled_from(["PNG", "JPEG"]), st.integers(0, 255)
)
videos = st.binary(min_size=1, max_size=48)
media = st.one_of(st.tuples(st.just("image"), images), st.tuples(st.just("video"), videos))


@st.composite
def interleaved(draw: st.DrawFn, medium: st.SearchStrategy[Medium] = media) -> list[TestPart]:
    """At least one text and one medium, in any order."""
    parts: list[TestPart] = [draw(texts), draw(medium)]
    parts += draw(st.lists(st.one_of(texts, medium), max_size=5))
    return draw(st.permutations(parts))


@st.composite
def pairs(draw: st.DrawFn, medium: st.SearchStrategy[Medium] = media) -> list[TestPart]:
    """Media, images before clips, then one text: a pair as every reader lays it out."""
    found = draw(st.lists(medium, min_size=1, max_size=4))
    return [*sorted(found, key=lambda m: m[0] == "video"), draw(texts)]


def comparable(parts: tuple[Any, ...] | list[Any]) -> list[Any]:
    """Parts with each MediaRef as (kind, data or path): what a test document holds."""
    return [(p.kind, p.data if p.data is not None else p.path) if isinstance(p, MediaRef) else p for p in parts]


def read_all(reader: Reader, max_bytes: int = 1 << 40) -> list[Document | DeadLetter]:
    return [
        item
        for layout in reader.layouts()
        for unit in split_file(reader.source, layout, max_bytes)
        for item in reader.read(unit)
    ]


def documents(items: list[Document | DeadLetter]) -> list[Document]:
    dead = [i for i in items if isinstance(i, DeadLetter)]
    assert not dead, f"unexpected dead letters: {dead}"
    return [i for i in items if isinstance(i, Document)]


# --- WebDataset ---------------------------------------------------------------------------------------------

EXTENSION = {"image": "png", "video": "mp4"}


def wds_sample(key: str, parts: list[TestPart], pair: bool, text_member: str) -> dict[str, Any]:
    """A sample for ``webdataset.TarWriter``: a pair's media as ``<n>.png``/``<n>.mp4`` (or a lone image as
    ``jpg``) with its text as ``.txt`` or a ``.json`` caption; an interleaved document's as a segments ``.json``."""
    sample: dict[str, Any] = {"__key__": key}
    media_parts = [p for p in parts if not isinstance(p, str)]
    names = ["jpg"] if pair and media_parts == parts[:1] and media_parts[0][0] == "image" else None
    segments = []
    for n, part in enumerate(parts):
        if isinstance(part, str):
            segments.append({"text": part})
            continue
        kind, data = part
        ext = names[0] if names else f"{n}.{EXTENSION[kind]}"
        sample[ext] = data
        segments.append({kind: ext})
    if not pair:
        sample["json"] = json.dumps({"segments": segments}).encode()
    elif text_member == "txt":
        sample["txt"] = parts[-1].encode()
    else:
        sample["json"] = json.dumps({text_member: parts[-1], "url": "https://example.com/x"}).encode()
    return sample


def write_shard(path: Path, samples: list[dict[str, Any]], tar_format: str = "USTAR_FORMAT") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out, webdataset.TarWriter(out, encoder=False, format=tar_format, mtime=0) as writer:
        for sample in samples:
            writer.write(sample)


@st.composite
def shard_documents(draw: st.DrawFn) -> list[tuple[bool, str, list[TestPart]]]:
    """(pair?, how a pair's text is stored, parts) for each sample of a shard."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        pair = draw(st.booleans())
        parts = draw(pairs()) if pair else draw(interleaved())
        out.append((pair, draw(st.sampled_from(["txt", "caption", "text"])), parts))
    return out


@settings(max_examples=40)
@given(
    docs=shard_documents(),
    prefix=st.sampled_from(["", "a/", "deep/er/"]),
    tar_format=st.sampled_from(TAR_FORMATS),
    max_bytes=st.integers(1, 1 << 14),
)
def test_webdataset_round_trip(
    docs: list[tuple[bool, str, list[TestPart]]], prefix: str, tar_format: str, max_bytes: int
) -> None:
    with scratch() as root:
        keys = [f"{prefix}{i:06d}" for i in range(len(docs))]
        write_shard(
            root / "s" / "shard-0.tar",
            [wds_sample(k, p, pair, t) for k, (pair, t, p) in zip(keys, docs, strict=True)],
            tar_format,
        )
        got = documents(read_all(make_reader("webdataset", "wds", root, content="media"), max_bytes))
    assert [d.row for d in got] == list(range(len(docs)))
    assert [d.document_id for d in got] == [f"wds/s/shard-0.tar/{i}" for i in range(len(docs))]
    assert [comparable(d.parts) for d in got] == [parts for _, _, parts in docs]
    for doc, key in zip(got, keys, strict=True):
        assert doc.where == f"s/shard-0.tar:key={key}"  # where later dead letters about it point
        assert all(p.where.startswith(f"s/shard-0.tar:key={key}.") for p in doc.parts if isinstance(p, MediaRef))


SKIPPED_NAMES = ("__meta__", "__index__/x.json", "README", "dir/noext", "__x__")
NAMED_DIRS = ("", "d/", "d.x/", "a/b/")


@st.composite
def member_names(draw: st.DrawFn) -> list[str]:
    """Runs of members (consecutive runs of different keys, a key's extensions distinct up to case), with
    members webdataset skips in between."""
    names: list[str] = []
    previous = None
    for _ in range(draw(st.integers(0, 7))):
        key = draw(st.sampled_from([d + b for d in NAMED_DIRS for b in ("k1", "k2", "K3") if d + b != previous]))
        previous = key
        extensions = draw(
            st.lists(
                st.sampled_from(["jpg", "txt", "json", "seg.1.png", "tar.gz", "mp4", "cls"]),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
        for ext in extensions:
            names.append(f"{key}.{ext.upper() if draw(st.booleans()) else ext}")
            if draw(st.integers(0, 4)) == 0:
                names.append(draw(st.sampled_from(SKIPPED_NAMES)))
    return names


def write_members(path: Path, names: list[str], tar_format: int = tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=tar_format) as tar:
        for n, name in enumerate(names):
            data = f"{n}:{name}".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("folder.jpg")  # a directory is no member of any sample
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)


@settings(max_examples=60)
@given(names=member_names(), tar_format=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_tar_members_group_as_webdataset_groups_them(names: list[str], tar_format: int) -> None:
    with scratch() as root:
        path = root / "s.tar"
        write_members(path, names, tar_format)
        with path.open("rb") as f:
            shard = TarShard(f)
            ours = [(g.key, [(e.extension, shard.read(e)) for e in g.members]) for g in shard.groups()]
        with path.open("rb") as f:
            expanded = webdataset.tariterators.tar_file_expander([{"url": str(path), "stream": f}])
            theirs = [
                (s["__key__"], [(k, v) for k, v in s.items() if not k.startswith("__")])
                for s in webdataset.tariterators.group_by_keys(expanded)
            ]
    assert ours == theirs


def caption_shard(root: Path, count: int) -> list[str]:
    """A shard of ``count`` image-caption pairs of varied sizes; their keys."""
    keys = [f"{i:05d}" for i in range(count)]
    write_shard(
        root / "shard.tar",
        [
            {"__key__": k, "jpg": bytes([i % 251]) * (1 + 700 * (i % 5)), "txt": f"caption {i}".encode()}
            for i, k in enumerate(keys)
        ],
    )
    return keys


@settings(max_examples=40)
@given(count=st.integers(1, 30), data=st.data())
def test_webdataset_units_cover_every_key_once(count: int, data: st.DataObject) -> None:
    with scratch() as root:
        keys = caption_shard(root, count)
        reader = WebDatasetReader("wds", root)
        (layout,) = reader.layouts()
        assert layout.num_rows == count
        cuts = sorted(data.draw(st.sets(st.integers(1, count - 1), max_size=count - 1)) if count > 1 else set())
        bounds = [0, *cuts, count]
        seek = data.draw(st.lists(st.booleans(), min_size=len(bounds) - 1, max_size=len(bounds) - 1))
        units = [
            WorkUnit("wds", "shard.tar", "rows", lo, hi, byte_offset=int(layout.row_bounds[lo]) if s else 0)
            for lo, hi, s in zip(bounds[:-1], bounds[1:], seek, strict=True)
        ]
        read = [item for unit in units for item in reader.read(unit)]
        split = [
            unit
            for whole in split_file("wds", layout, 1 << 40)
            for unit in split_unit(whole, layout, data.draw(st.integers(1, 1 << 13)))
        ]
        again = [item for unit in split for item in reader.read(unit)]
    for items in (read, again):
        got = documents(items)
        assert [d.row for d in got] == list(range(count))
        assert [d.parts[-1] for d in got] == [f"caption {i}" for i in range(count)]
        assert [d.parts[0].where for d in got] == [f"shard.tar:key={k}.jpg" for k in keys]


BAD_SAMPLES: dict[str, tuple[dict[str, bytes], str]] = {
    "media, no text": ({"jpg": b"img"}, "no text"),
    "text, no media": ({"txt": b"a caption"}, "no image or video"),
    "json caption, no media": ({"json": b'{"caption": "c"}'}, "no image or video"),
    "unparsable json": ({"jpg": b"img", "json": b'{"caption": '}, "unparsable .json"),
    "json not an object": ({"jpg": b"img", "json": b'["caption"]'}, "not an object"),
    "json without text": ({"jpg": b"img", "json": b'{"url": "x"}'}, "no text"),
    "caption not a string": ({"jpg": b"img", "json": b'{"caption": 3}'}, "not a string"),
    "txt not UTF-8": ({"jpg": b"img", "txt": b"\xff\xfe"}, "not UTF-8"),
    "two members of one extension": ({"jpg": b"a", "JPG": b"b", "txt": b"t"}, "two members with the extension 'jpg'"),
    "segment names no member": (
        {"1.png": b"i", "json": b'{"segments": [{"text": "t"}, {"image": "2.png"}]}'},
        "no image member",
    ),
    "segment names a member of another kind": (
        {"txt": b"t", "json": b'{"segments": [{"text": "t"}, {"image": "txt"}]}'},
        "no image member",
    ),
    "segment with two values": (
        {"1.png": b"i", "json": b'{"segments": [{"text": "t", "image": "1.png"}]}'},
        "exactly one of",
    ),
    "segments not a list": ({"1.png": b"i", "json": b'{"segments": "t"}'}, "not a list"),
    "segments with no media": ({"1.png": b"i", "json": b'{"segments": [{"text": "t"}]}'}, "no image or video"),
}


@settings(max_examples=30)
@given(bad=st.lists(st.sampled_from(sorted(BAD_SAMPLES)), min_size=1, max_size=6, unique=True), data=st.data())
def test_webdataset_bad_samples_are_dead_letters(bad: list[str], data: st.DataObject) -> None:
    good = data.draw(st.lists(pairs(), max_size=4))
    order = data.draw(st.permutations([("bad", name) for name in bad] + [("good", i) for i in range(len(good))]))
    samples, expected_dead, expected_docs = [], {}, []
    for n, (what, which) in enumerate(order):
        key = f"k{n:03d}"
        if what == "bad":
            members, reason = BAD_SAMPLES[which]
            samples.append({"__key__": key, **members})
            expected_dead[f"s.tar:key={key}"] = reason
        else:
            samples.append(wds_sample(key, good[which], pair=True, text_member="txt"))
            expected_docs.append((n, good[which]))
    with scratch() as root:
        write_shard(root / "s.tar", samples)
        items = read_all(WebDatasetReader("wds", root), max_bytes=data.draw(st.integers(1, 1 << 12)))
    dead = {i.location: i for i in items if isinstance(i, DeadLetter)}
    assert set(dead) == set(expected_dead)
    for where, reason in expected_dead.items():
        assert reason in dead[where].reason, (where, dead[where].reason)
        assert dead[where].source == "wds"
    assert [(d.row, comparable(d.parts)) for d in items if isinstance(d, Document)] == expected_docs
    assert [d.where for d in items if isinstance(d, Document)] == [f"s.tar:key=k{n:03d}" for n, _ in expected_docs]


def test_webdataset_broken_shards(tmp_path: Path) -> None:
    caption_shard(tmp_path, 4)
    whole = (tmp_path / "shard.tar").read_bytes()
    reader = WebDatasetReader("wds", tmp_path)
    (layout,) = reader.layouts()
    # cut inside the last sample's image: the samples before it are read, the rest is one dead letter
    (tmp_path / "shard.tar").write_bytes(whole[: int(layout.row_bounds[3]) + 600])
    items = read_all(reader, max_bytes=1)
    assert [d.row for d in items if isinstance(d, Document)] == [0, 1, 2]
    (dead,) = [i for i in items if isinstance(i, DeadLetter)]
    assert dead.location == "shard.tar:key=00003" and "unexpected end of data" in dead.reason
    # bytes after the last member that are no tar header
    (tmp_path / "shard.tar").write_bytes(whole[: int(layout.row_bounds[4])] + b"\x01" * 700)
    (bad_layout,) = reader.layouts()
    assert bad_layout.problem is not None and "not a tar header" in bad_layout.problem
    items = read_all(reader)  # the last key may have lost a member to them: it is a dead letter too
    assert [d.row for d in items if isinstance(d, Document)] == [0, 1, 2]
    assert [i.location for i in items if isinstance(i, DeadLetter)] == ["shard.tar:key=00003"]
    # not a tar at all, and a gzipped one
    for name, data in (("shard.tar", b"not a tar" * 100), ("shard.tar", __import__("gzip").compress(whole))):
        (tmp_path / name).write_bytes(data)
        (dead,) = read_all(reader)
        assert isinstance(dead, DeadLetter) and dead.location == "shard.tar"
        assert "not a readable uncompressed tar archive" in dead.reason
    # a unit planned on an older shard that now ends sooner
    (tmp_path / "shard.tar").write_bytes(whole)
    items = list(reader.read(WorkUnit("wds", "shard.tar", "rows", 2, 6, byte_offset=int(layout.row_bounds[2]))))
    assert [type(i) for i in items] == [Document, Document, DeadLetter]
    assert items[-1].location == "shard.tar" and "shard ends at sample 4, before sample 6" in items[-1].reason
    # a byte offset that is no member's header
    items = list(reader.read(WorkUnit("wds", "shard.tar", "rows", 1, 2, byte_offset=int(layout.row_bounds[1]) + 512)))
    assert [type(i) for i in items] == [DeadLetter]


def test_webdataset_reader_does_not_load_torch() -> None:
    # importing the webdataset package loads torch; the reader follows its rules without it
    code = "import sys, connectors.readers.webdataset_shards; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


# --- JSONL ----------------------------------------------------------------------------------------------------

path_names = st.text("abcxyz_-é ", min_size=1, max_size=6)
media_paths = st.builds(
    lambda kind, folders, name: (kind, "/".join([*folders, f"{name}.{EXTENSION[kind]}"])),
    st.sampled_from(["image", "video"]),
    st.lists(path_names, max_size=2),
    path_names,
)


@st.composite
def jsonl_record(draw: st.DrawFn, parts: list[TestPart], pair: bool) -> dict[str, Any]:
    """``parts`` as a JSONL row: a pair under ``image``/``images``/``video``/``videos`` and ``text``/``caption``,
    or segments (a text segment sometimes a bare string)."""
    record: dict[str, Any] = {"id": draw(st.integers(0, 99))}
    if not pair:
        record["segments"] = [
            (p if draw(st.booleans()) else {"text": p}) if isinstance(p, str) else {p[0]: p[1]} for p in parts
        ]
        return record
    for kind in ("image", "video"):
        paths = [p[1] for p in parts if not isinstance(p, str) and p[0] == kind]
        if len(paths) == 1 and draw(st.booleans()):
            record[kind] = paths[0]
        elif paths or draw(st.booleans()):
            record[kind + "s"] = paths
    record[draw(st.sampled_from(["text", "caption"]))] = parts[-1]
    return record


@settings(max_examples=40)
@given(
    shapes=st.lists(st.booleans(), min_size=1, max_size=10),
    data=st.data(),
    max_bytes=st.integers(1, 4096),
)
def test_jsonl_round_trip(shapes: list[bool], data: st.DataObject, max_bytes: int) -> None:
    docs = [data.draw(pairs(media_paths) if pair else interleaved(media_paths)) for pair in shapes]
    lines = [json.dumps(data.draw(jsonl_record(parts, pair))) for parts, pair in zip(docs, shapes, strict=True)]
    with scratch() as root:
        (root / "rows.jsonl").write_text("\n".join(lines) + "\n")
        got = documents(read_all(JsonlReader("vl", root, content="media"), max_bytes))
    assert [comparable(d.parts) for d in got] == docs
    for doc in got:
        kinds = [p.kind for p in doc.parts if isinstance(p, MediaRef)]
        wheres = [p.where for p in doc.parts if isinstance(p, MediaRef)]
        assert wheres == [f"rows.jsonl:row={doc.row}:{k}={kinds[:i].count(k)}" for i, k in enumerate(kinds)]


BAD_RECORDS: dict[str, tuple[dict[str, Any], str]] = {
    "parent path": ({"image": "../x.jpg", "text": "t"}, "image 0: path '../x.jpg' leaves the source root"),
    "absolute path": ({"image": "/etc/x.jpg", "text": "t"}, "leaves the source root"),
    "path out through a folder": ({"images": ["a.jpg", "a/../../x.jpg"], "text": "t"}, "image 1: path"),
    "empty path": ({"image": "", "text": "t"}, "names no file"),
    "root itself": ({"video": "a/..", "text": "t"}, "names no file"),
    "segment path out": ({"segments": ["t", {"video": "../v.mp4"}]}, "video 0: path '../v.mp4' leaves"),
    "image a number": ({"image": 5, "text": "t"}, "image 0: is int"),
    "bytes as a string": ({"image": {"bytes": "aGk="}, "text": "t"}, "bytes is str"),
    "struct of nothing": ({"image": {"bytes": None, "path": None}, "text": "t"}, "neither bytes nor path"),
    "no text": ({"image": "a.jpg"}, "no text"),
    "empty text": ({"image": "a.jpg", "text": ""}, "no text"),
    "no media": ({"text": "t", "images": []}, "no image or video"),
    "text a list": ({"image": "a.jpg", "text": ["t"]}, "text is list"),
    "segments an object": ({"segments": {"text": "t"}}, "segments is dict"),
    "segment of two": ({"segments": [{"text": "t", "image": "a.jpg"}]}, "segment 0 must hold exactly one"),
    "segment of none": ({"segments": ["t", {"image": "a.jpg"}, {"url": "x"}]}, "segment 2 must hold exactly one"),
    "segment a number": ({"segments": ["t", 3]}, "segment 1 is int"),
}


@settings(max_examples=30)
@given(bad=st.lists(st.sampled_from(sorted(BAD_RECORDS)), min_size=1, max_size=6, unique=True), data=st.data())
def test_jsonl_bad_records_are_dead_letters(bad: list[str], data: st.DataObject) -> None:
    good = data.draw(st.lists(pairs(media_paths), max_size=4))
    order = data.draw(st.permutations([("bad", n) for n in bad] + [("good", i) for i in range(len(good))]))
    lines = [
        json.dumps(
            BAD_RECORDS[which][0]
            if what == "bad"
            else {
                "images": [p[1] for p in good[which][:-1] if p[0] == "image"],
                "videos": [p[1] for p in good[which][:-1] if p[0] == "video"],
                "text": good[which][-1],
            }
        )
        for what, which in order
    ]
    with scratch() as root:
        (root / "r.jsonl").write_text("\n".join(lines))
        items = read_all(JsonlReader("vl", root, content="media"), max_bytes=data.draw(st.integers(1, 512)))
    dead = {i.location: i for i in items if isinstance(i, DeadLetter)}
    expected = {f"r.jsonl:row={row}": BAD_RECORDS[which][1] for row, (what, which) in enumerate(order) if what == "bad"}
    assert set(dead) == set(expected)
    for where, reason in expected.items():
        assert reason in dead[where].reason, (where, dead[where].reason)
        assert dead[where].source == "vl" and dead[where].payload.rstrip() == lines[int(where.split("=")[1])].encode()
    good_rows = [(row, good[which]) for row, (what, which) in enumerate(order) if what == "good"]
    assert [(d.row, comparable(d.parts)) for d in items if isinstance(d, Document)] == good_rows


def test_jsonl_media_fields_and_missing_files(tmp_path: Path) -> None:
    rows = [
        {"img": "x/./y.jpg", "prompt": "p"},
        {"frames": "missing.mp4", "prompt": "q"},
        {"image": "a.jpg", "text": "t"},
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    fields = MediaFields(text=("prompt",), image=("img",), video=("frames",), segments=("interleaved",))
    items = read_all(make_reader("jsonl", "vl", tmp_path, content="media", media_fields=fields))
    assert [comparable(i.parts) for i in items if isinstance(i, Document)] == [
        [("image", "x/y.jpg"), "p"],  # normalised; a file that is not there is the decoder's to report
        [("video", "missing.mp4"), "q"],
    ]
    (dead,) = [i for i in items if isinstance(i, DeadLetter)]
    assert dead.location == "r.jsonl:row=2" and dead.reason == "no image or video"
    # a text reader of the same file reads its text
    assert [d.text for d in read_all(JsonlReader("vl", tmp_path)) if isinstance(d, Document)] == ["t"]


# --- Parquet and Arrow ----------------------------------------------------------------------------------------


def hf_image(data: bytes, path: str | None = None) -> dict[str, Any]:
    """A value of Hugging Face ``datasets``' ``Image()`` (and ``Video()``) feature as it stores it."""
    return {"bytes": data, "path": path}


def media_table(form: str, docs: list[list[TestPart]], binary: bool) -> pa.Table:
    """``docs`` in one of the layouts the readers take: ``single`` (one image a row, an ``Image()`` struct or
    plain binary, and ``caption``), ``lists`` (``images``/``videos`` lists of structs, ``text``) or
    ``segments`` (``list<struct<text, image, video>>``)."""
    image_type = pa.binary() if binary else IMAGE_STRUCT

    def value(data: bytes) -> object:
        return data if binary else hf_image(data, "orig/name.jpg")

    if form == "single":
        images = [value(parts[0][1]) for parts in docs]
        return pa.table({"caption": [parts[-1] for parts in docs], "image": pa.array(images, image_type)})
    if form == "lists":
        columns = {
            kind + "s": pa.array(
                [[hf_image(p[1]) for p in parts if not isinstance(p, str) and p[0] == kind] for parts in docs],
                pa.list_(IMAGE_STRUCT),
            )
            for kind in ("image", "video")
        }
        return pa.table({**columns, "text": [parts[-1] for parts in docs], "other": list(range(len(docs)))})
    segment = pa.struct([("text", pa.string()), ("image", image_type), ("video", image_type)])
    rows = [[{"text": p} if isinstance(p, str) else {p[0]: value(p[1])} for p in parts] for parts in docs]
    return pa.table({"segments": pa.array(rows, pa.list_(segment))})


@st.composite
def table_documents(draw: st.DrawFn) -> tuple[str, list[list[TestPart]]]:
    form = draw(st.sampled_from(["single", "lists", "segments"]))
    count = draw(st.integers(1, 12))
    if form == "single":
        docs = [[("image", draw(images)), draw(texts)] for _ in range(count)]
    else:
        docs = [draw(pairs() if form == "lists" else interleaved()) for _ in range(count)]
    return form, docs


@settings(max_examples=40)
@given(
    table=table_documents(), binary=st.booleans(), row_group_size=st.integers(1, 5), max_bytes=st.integers(1, 1 << 13)
)
def test_parquet_round_trip(
    table: tuple[str, list[list[TestPart]]], binary: bool, row_group_size: int, max_bytes: int
) -> None:
    form, docs = table
    with scratch() as root:
        pq.write_table(media_table(form, docs, binary), root / "t.parquet", row_group_size=row_group_size)
        reader = ParquetReader("vl", root, content="media")
        (layout,) = reader.layouts()
        by_group = documents(read_all(reader, max_bytes))
        by_rows = documents(
            [
                i
                for w in split_file("vl", layout, 1 << 40)
                for u in split_unit(w, layout, max_bytes)
                for i in reader.read(u)
            ]
        )
    for got in (by_group, by_rows):
        assert [d.row for d in got] == list(range(len(docs)))
        assert [comparable(d.parts) for d in got] == docs


@settings(max_examples=20)
@given(table=table_documents(), binary=st.booleans(), max_bytes=st.integers(1, 1 << 13))
def test_arrow_round_trip(table: tuple[str, list[list[TestPart]]], binary: bool, max_bytes: int) -> None:
    form, docs = table
    with scratch() as root:
        arrow = media_table(form, docs, binary)
        with pa.OSFile(str(root / "t.arrow"), "wb") as sink, pa.ipc.new_stream(sink, arrow.schema) as writer:
            writer.write_table(arrow, max_chunksize=3)  # as datasets' save_to_disk writes: the stream format
        got = documents(read_all(ArrowReader("vl", root, content="media"), max_bytes))
    assert [comparable(d.parts) for d in got] == docs


def test_parquet_bad_rows_and_files(tmp_path: Path) -> None:
    image = pa.array(
        [
            hf_image(b"ok"),
            None,
            {"bytes": None, "path": None},
            {"bytes": None, "path": "../up.jpg"},
            {"bytes": None, "path": "in/root.jpg"},
            hf_image(b"x"),
        ],
        IMAGE_STRUCT,
    )
    pq.write_table(
        pa.table({"image": image, "text": ["a", "b", "c", "d", "e", None]}), tmp_path / "p.parquet", row_group_size=2
    )
    segment = pa.struct([("text", pa.string()), ("image", IMAGE_STRUCT)])
    segments = [[{"text": "t", "image": hf_image(b"i")}], [{"text": "t"}, {"image": hf_image(b"i")}], []]
    pq.write_table(pa.table({"segments": pa.array(segments, pa.list_(segment))}), tmp_path / "s.parquet")
    pq.write_table(pa.table({"text": ["only text"]}), tmp_path / "text_only.parquet")
    pq.write_table(pa.table({"image": pa.array([b"i"], pa.binary())}), tmp_path / "image_only.parquet")
    items = read_all(ParquetReader("vl", tmp_path, content="media"), max_bytes=1)
    docs = {i.document_id: comparable(i.parts) for i in items if isinstance(i, Document)}
    assert docs == {
        "vl/p.parquet/0": [("image", b"ok"), "a"],
        "vl/p.parquet/4": [("image", "in/root.jpg"), "e"],
        "vl/s.parquet/1": ["t", ("image", b"i")],
    }
    dead = {i.location: i.reason for i in items if isinstance(i, DeadLetter)}
    assert dead == {
        "p.parquet:row=1": "no image or video",
        "p.parquet:row=2": "image 0: has neither bytes nor path",
        "p.parquet:row=3": "image 0: path '../up.jpg' leaves the source root",
        "p.parquet:row=5": "no text",
        "s.parquet:row=0": "segment 0 must hold exactly one of text, image and video, not text, image",
        "s.parquet:row=2": "no image or video",
        "text_only.parquet": "no image or video column (image, images, video, videos) and no segments column "
        "(segments) (columns: text)",
        "image_only.parquet": "no text column (text, caption) and no segments column (segments) (columns: image)",
    }


def test_content_kinds_per_reader(tmp_path: Path) -> None:
    assert WebDatasetReader("wds", tmp_path).content == "media"
    with pytest.raises(ValueError, match="content 'text' of source wds is not one of media"):
        make_reader("webdataset", "wds", tmp_path)
    with pytest.raises(ValueError, match="not one of text for TextReader"):
        TextReader("t", tmp_path, content="media")
    assert make_reader("webdataset", "wds", tmp_path, content="media").glob == "**/*.tar"
    with pytest.raises(ValueError, match="distinct"):
        MediaFields(text=("text",), image=("text",))


class CountingReads(io.FileIO):
    """A file that counts the bytes read from it."""

    read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.read_bytes += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        count = super().readinto(buffer)
        self.read_bytes += count or 0
        return count


def test_webdataset_layout_reads_headers_only(tmp_path: Path) -> None:
    big = 64 << 10
    write_shard(tmp_path / "s.tar", [{"__key__": f"{i:04d}", "jpg": b"\x01" * big, "txt": b"c"} for i in range(20)])
    with CountingReads(tmp_path / "s.tar") as file:
        groups = list(TarShard(file).groups())
        assert len(groups) == 20
        # a header block per member (and a byte before each to find a truncated member), and the trailer
        assert file.read_bytes < 40 * 1024 + 10240 < big
