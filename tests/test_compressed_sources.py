"""Compressed source files on a local disk: gzip and zstd JSON lines, in one stream or in members and frames,
give the plain file's rows, dead letters and samples, token for token, whatever the units; a unit of a member or
frame reads from it on; a broken file gives every row before the break and one dead letter saying where."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.compression import FrameIndex, codec_of, decode_frames
from connectors.planning import split_file, split_unit
from connectors.readers import Document, JsonlReader, TextReader, make_reader
from connectors.storage import glob_matches
from tests.compression_support import (
    EXTENSIONS,
    FORMS,
    SINGLE_STREAM,
    Read,
    codec_of_form,
    compress,
    corpora,
    corrupt,
    cut_points,
    pieces,
    read_units,
    units_of,
)
from topics.formats.dead_letter import DeadLetter
from topics.formats.file_formats import FILE_FORMATS, glob_alternatives

FAST = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])


def write_pair(folder: Path, data: bytes, form: str, cuts: list[int]) -> tuple[str, str]:
    """``data`` as ``plain/rows.jsonl`` and compressed as ``packed/rows.jsonl.<ext>``; the two paths."""
    ext = EXTENSIONS[codec_of_form(form)]
    for sub, name, body in (("plain", "rows.jsonl", data), ("packed", f"rows.jsonl{ext}", compress(data, form, cuts))):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / sub / name).write_bytes(body)
    return "rows.jsonl", f"rows.jsonl{ext}"


def read_plain(folder: Path, path: str, content: str = "text") -> Read:
    plain = JsonlReader("web", folder / "plain", field=content, content=content)  # type: ignore[arg-type]
    return read_units(plain, units_of(plain, 1 << 30), path)


@FAST
@given(
    data=corpora(),
    form=st.sampled_from(FORMS),
    fractions=st.lists(st.floats(0, 1), max_size=6),
    aligned=st.booleans(),
    max_bytes=st.sampled_from([150, 600, 1 << 30]),
    content=st.sampled_from(["text", "tokens"]),
)
def test_a_compressed_file_reads_as_the_plain_one(
    tmp_path_factory: pytest.TempPathFactory,
    data: bytes,
    form: str,
    fractions: list[float],
    aligned: bool,
    max_bytes: int,
    content: str,
) -> None:
    folder = tmp_path_factory.mktemp("corpus")
    plain_path, packed_path = write_pair(folder, data, form, cut_points(data, fractions, aligned))
    plain = JsonlReader("web", folder / "plain")
    packed = JsonlReader("web", folder / "packed", field=content, content=content)  # type: ignore[arg-type]
    assert packed.files() == [packed_path]
    [plain_layout], [layout] = plain.layouts(), packed.layouts()
    assert layout.num_rows == plain_layout.num_rows and layout.content_bytes == len(data)
    assert layout.size_bytes == (folder / "packed" / packed_path).stat().st_size
    units = split_file("web", layout, max_bytes)
    assert [u.start for u in units] == [0, *(u.stop for u in units)][: len(units)]  # every row once, in order
    assert sum(u.num_rows for u in units) == layout.num_rows
    if form in SINGLE_STREAM and layout.num_rows:
        assert [u.kind for u in units] == ["file"]
    expected = read_plain(folder, plain_path, content)
    assert read_units(packed, units, packed_path) == expected
    if units and units[0].kind == "file":  # a loader's split of the whole-file unit reads the same
        finer = split_unit(units[0], layout, max(1, max_bytes // 4))
        assert read_units(packed, finer, packed_path) == expected


@FAST
@given(
    data=corpora(max_rows=80),
    form=st.sampled_from(["gzip-members", "zstd-frames", "pzstd", "zstd-seekable"]),
    fractions=st.lists(st.floats(0, 1), min_size=2, max_size=8),
    aligned=st.booleans(),
)
def test_a_unit_of_a_member_reads_from_that_member_on(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, form: str, fractions: list[float], aligned: bool
) -> None:
    """Each unit is read with every byte before its ``byte_offset`` overwritten: it never decodes them."""
    folder = tmp_path_factory.mktemp("corpus")
    plain_path, packed_path = write_pair(folder, data, form, cut_points(data, fractions, aligned))
    packed = JsonlReader("web", folder / "packed")
    units = split_file("web", packed.layout(packed_path), 100)
    expected = read_plain(folder, plain_path)
    stored = (folder / "packed" / packed_path).read_bytes()
    got = []
    for unit in units:
        (folder / "packed" / packed_path).write_bytes(b"\x00" * unit.byte_offset + stored[unit.byte_offset :])
        got += read_units(packed, [unit], packed_path).items
    assert got == expected.items


def test_units_of_a_file_of_many_members_are_its_members_and_cost_their_decompressed_bytes(tmp_path: Path) -> None:
    """Members of whole lines (``cat a.gz b.gz``): one unit per member at a target of one member's bytes, each
    starting at its member with nothing to skip, costed at its decompressed bytes."""
    members = [
        b"".join(json.dumps({"text": f"m{m} r{r} " + "z" * r}).encode() + b"\n" for r in range(40)) for m in range(5)
    ]
    (tmp_path / "cat.jsonl.gz").write_bytes(b"".join(gzip.compress(m, mtime=0) for m in members))
    layout = JsonlReader("web", tmp_path).layout("cat.jsonl.gz")
    assert layout.frames is not None and layout.frames.count == 5
    units = split_file("web", layout, len(members[0]))
    offsets = np.cumsum([0] + [len(gzip.compress(m, mtime=0)) for m in members[:-1]]).tolist()
    assert [(u.start, u.stop, u.byte_offset, u.skip_bytes) for u in units] == [
        (40 * m, 40 * (m + 1), offsets[m], 0) for m in range(5)
    ]
    assert [u.estimated_bytes for u in units] == [len(m) for m in members]


@pytest.mark.parametrize("form", FORMS)
def test_a_single_frame_file_is_one_unit_and_says_so_nowhere_else(tmp_path: Path, form: str) -> None:
    data = b"".join(json.dumps({"text": f"r{r} " + "q" * (r % 90)}).encode() + b"\n" for r in range(500))
    name = f"one.jsonl{EXTENSIONS[codec_of_form(form)]}"
    (tmp_path / name).write_bytes(compress(data, form))
    units = split_file("web", JsonlReader("web", tmp_path).layout(name), 1_000)
    assert [(u.kind, u.start, u.stop) for u in units] == [("file", 0, 500)]


CORRUPTIONS = ("cut", "garbage", "bad-frame")


@FAST
@given(
    data=corpora(max_rows=80).filter(lambda d: d.count(b"\n") >= 3),
    form=st.sampled_from(FORMS),
    how=st.sampled_from(CORRUPTIONS),
    fractions=st.lists(st.floats(0, 1), max_size=5),
    max_bytes=st.sampled_from([200, 1 << 30]),
)
def test_a_broken_file_gives_every_row_before_the_break_and_one_letter(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, form: str, how: str, fractions: list[float], max_bytes: int
) -> None:
    folder = tmp_path_factory.mktemp("corpus")
    cuts = cut_points(data, fractions, aligned=True)
    plain_path, packed_path = write_pair(folder, data, form, cuts)
    broken = corrupt((folder / "packed" / packed_path).read_bytes(), form, how)
    (folder / "packed" / packed_path).write_bytes(broken)
    packed = JsonlReader("web", folder / "packed")
    got = read_units(packed, units_of(packed, max_bytes), packed_path).items
    expected = read_plain(folder, plain_path).items
    letters = [item for item in got if item[0] == "dead" and "cannot decompress" in str(item[2])]
    assert len(letters) == 1, got
    [(_, where, reason)] = letters
    first = int(str(where).removeprefix("FILE:row="))
    noun = "gzip member" if codec_of_form(form) == "gzip" else "zstd frame"
    assert str(reason).startswith(f"cannot decompress: {noun} at byte ")
    assert got[: got.index(letters[0])] == [item for item in expected if _row(item) < first]
    assert got[-1] == letters[0]
    if how == "garbage":  # every row decodes; the letter is for the bytes after them
        assert first == data.count(b"\n") + (not data.endswith(b"\n"))
    elif form not in SINGLE_STREAM:  # the members before the broken last one are read whole
        intact = pieces(data, cuts)[:-1]
        assert first >= sum(piece.count(b"\n") for piece in intact)


def _row(item: tuple[object, ...]) -> int:
    return int(item[1]) if item[0] == "doc" else int(str(item[1]).rsplit("=", 1)[1])


def test_a_file_named_gz_that_is_not_gzip_is_one_letter_saying_so(tmp_path: Path) -> None:
    (tmp_path / "plain.jsonl.gz").write_bytes(b'{"text": "plain after all"}\n' * 50)
    (tmp_path / "good.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n'))
    reader = JsonlReader("web", tmp_path)
    items = [item for unit in units_of(reader, 1 << 30) for item in reader.read(unit)]
    assert [i.text for i in items if isinstance(i, Document)] == ["fine"]
    [letter] = [i for i in items if isinstance(i, DeadLetter)]
    assert letter.location == "plain.jsonl.gz:row=0"
    assert letter.reason.startswith("cannot decompress: gzip member at byte 0 does not decode: ")
    assert "incorrect header check" in letter.reason


def test_text_files_compressed_or_not_are_the_same_documents(tmp_path: Path) -> None:
    texts = {f"doc{i}": f"document {i}\n" + "é ∑ 字 " * (i * 50) for i in range(4)}
    for (name, text), ext in zip(texts.items(), ["", ".gz", ".zst", ".zstd"], strict=True):
        body = text.encode()
        body = gzip.compress(body) if ext == ".gz" else zstandard.ZstdCompressor().compress(body) if ext else body
        (tmp_path / f"{name}.txt{ext}").write_bytes(body)
    (tmp_path / "broken.txt.gz").write_bytes(gzip.compress(b"cut short")[:-5])
    reader = TextReader("topics", tmp_path)
    assert reader.files() == ["broken.txt.gz", "doc0.txt", "doc1.txt.gz", "doc2.txt.zst", "doc3.txt.zstd"]
    items = {
        i.location if isinstance(i, DeadLetter) else i.path: i for u in units_of(reader, 1) for i in reader.read(u)
    }
    assert {path.split(".")[0]: i.text for path, i in items.items() if isinstance(i, Document)} == texts
    letter = items["broken.txt.gz"]
    assert isinstance(letter, DeadLetter)
    assert letter.reason.startswith("cannot decompress: gzip member at byte 0 is cut short: the data ends at byte")


def test_default_globs_take_the_compressed_files_and_nothing_else(tmp_path: Path) -> None:
    names = ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d/e.jsonl.zstd", "f.jsonl.bak", "g.json.gz", "h.gz", "i.txt.gz"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert make_reader("jsonl", "web", tmp_path).files() == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d/e.jsonl.zstd"]
    assert make_reader("text", "web", tmp_path).files() == ["i.txt.gz"]
    assert make_reader("jsonl", "web", tmp_path, glob="**/*.json.gz").files() == ["g.json.gz"]
    listed = [name for name in names if glob_matches(FILE_FORMATS["jsonl"].default_glob, name)]
    assert listed == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d/e.jsonl.zstd"]


@settings(deadline=None, max_examples=200)
@given(
    head=st.text("ab/", max_size=3),
    options=st.lists(st.text("ab.*", max_size=3), min_size=2, max_size=4),
    tail=st.text("ab.*", max_size=3),
    path=st.text("ab./", min_size=1, max_size=8).filter(lambda p: "//" not in p and not p.startswith("/")),
)
def test_a_glob_with_braces_matches_what_one_of_its_alternatives_matches(
    head: str, options: list[str], tail: str, path: str
) -> None:
    pattern = head + "{" + ",".join(options) + "}" + tail
    alternatives = glob_alternatives(pattern)
    assert alternatives == list(dict.fromkeys(head + option + tail for option in options))
    assert glob_matches(pattern, path) == any(glob_matches(each, path) for each in alternatives)


def test_glob_alternatives_expand_as_a_shell_does() -> None:
    assert glob_alternatives("**/*.jsonl") == ["**/*.jsonl"]
    assert glob_alternatives("{a,b}/{c,d}.x") == ["a/c.x", "a/d.x", "b/c.x", "b/d.x"]
    assert glob_alternatives("x.{jsonl,{gz,zst}}") == ["x.jsonl", "x.gz", "x.zst"]
    assert glob_alternatives("lone{brace}") == ["lone{brace}"]
    assert FILE_FORMATS["jsonl"].default_glob == "**/*.{jsonl,jsonl.gz,jsonl.zst,jsonl.zstd}"


def test_compression_by_name_and_by_content_encoding() -> None:
    assert [codec_of(p) for p in ("a.gz", "a.JSONL.GZ", "a.zst", "a.zstd", "a.jsonl", "gz")] == [
        "gzip",
        "gzip",
        "zstd",
        "zstd",
        None,
        None,
    ]
    assert [codec_of("a.jsonl", e) for e in ("gzip", "x-gzip", " GZIP ", "zstd", "identity", "utf-8", "")] == [
        "gzip",
        "gzip",
        "gzip",
        "zstd",
        None,
        None,
        None,
    ]
    assert codec_of("a.zst", "gzip") == "zstd"  # the name first


@settings(deadline=None, max_examples=100)
@given(
    data=st.binary(max_size=2_000),
    fractions=st.lists(st.floats(0, 1), max_size=6),
    form=st.sampled_from(FORMS),
    chunk=st.sampled_from([1, 7, 1 << 20]),
)
def test_frames_decode_to_the_data_and_start_where_their_bytes_do(
    data: bytes, fractions: list[float], form: str, chunk: int
) -> None:
    stored = compress(data, form, cut_points(data, fractions, aligned=False))
    codec = codec_of_form(form)
    frames: list[int] = []
    out = b""
    for frame, piece in decode_frames(chunked(stored, chunk), codec):  # type: ignore[arg-type]
        if not piece:
            frames.append(frame)
        out += piece
    assert out == data
    for at in frames:  # each frame decodes from its own first byte to the end of the data
        rest = b"".join(piece for _, piece in decode_frames(chunked(stored[at:], chunk), codec, at))  # type: ignore[arg-type]
        assert data.endswith(rest)


def chunked(data: bytes, size: int) -> Callable[[int], bytes]:
    """A ``read`` that gives ``data`` ``size`` bytes at a time, whatever it is asked for."""
    chunks = iter([data[i : i + size] for i in range(0, len(data), size)])
    return lambda _: next(chunks, b"")


def test_frame_index_cuts_at_the_first_row_begun_in_each_frame() -> None:
    bounds = np.array([0, 10, 20, 30, 40], dtype=np.int64)  # four rows
    frames = FrameIndex(np.array([0, 100, 200, 300]), np.array([0, 15, 20, 45]))
    assert frames.cut_rows(bounds).tolist() == [0, 2, 4]
    assert frames.entry(20) == (200, 0) and frames.entry(30) == (200, 10) and frames.entry(5) == (0, 5)
    with pytest.raises(ValueError, match="as many offsets as starts"):
        FrameIndex(np.array([0, 1]), np.array([0]))
