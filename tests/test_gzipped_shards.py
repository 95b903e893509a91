"""WebDataset shards as datasets ship them: gzipped (``.tar.gz``, ``.tgz``), captions in ``.txt`` or
``.caption`` members, conversations in ``.json``; read as their uncompressed ``.tar`` is."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

import matplotlib.cbook
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import Document, MediaRef, make_reader
from topics.formats.dead_letter import DeadLetter

IMAGES = ("grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png")


def sample_image(name: str) -> bytes:
    with matplotlib.cbook.get_sample_data(name) as file:
        return file.read()


def write_shard(path: Path, members: list[tuple[str, bytes]], mode: str) -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def read_all(root: Path, glob: str, max_bytes: int = 1 << 40) -> list[Document | DeadLetter]:
    reader = make_reader("webdataset", "wds", root, glob, content="media")
    return [
        item
        for layout in reader.layouts()
        for unit in split_file("wds", layout, max_bytes)
        for item in reader.read(unit)
    ]


def comparable(items: list[Document | DeadLetter]) -> list[object]:
    return [
        [(p.kind, p.data, p.where) if isinstance(p, MediaRef) else p for p in i.parts or ()] + [i.trained]
        if isinstance(i, Document)
        else (i.location, i.reason)
        for i in items
    ]


# a sample: (image index, caption, caption member extension)
samples = st.lists(
    st.tuples(
        st.sampled_from(range(len(IMAGES))),
        st.text(min_size=1, max_size=8),
        st.sampled_from(["txt", "caption", "json", "chat"]),
    ),
    min_size=1,
    max_size=6,
)


def members(drawn: list[tuple[int, str, str]]) -> list[tuple[str, bytes]]:
    out = []
    for k, (image, caption, kind) in enumerate(drawn):
        key = f"{k:09d}"
        out.append((f"{key}.jpg", sample_image(IMAGES[image])))
        if kind == "chat":
            turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": caption}]
            out.append((f"{key}.json", json.dumps({"conversations": turns}).encode()))
        elif kind == "json":
            out.append((f"{key}.json", json.dumps({"caption": caption, "url": "https://example.com"}).encode()))
        else:
            out.append((f"{key}.{kind}", caption.encode()))
    return out


@settings(max_examples=20, deadline=None)
@given(samples, st.sampled_from(["tar.gz", "tgz"]))
def test_gzipped_shards_read_as_their_tar(drawn: list[tuple[int, str, str]], suffix: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "plain").mkdir()
        (root / "gz").mkdir()
        write_shard(root / "plain" / "00000.tar", members(drawn), "w")
        write_shard(root / "gz" / f"00000.{suffix}", members(drawn), "w:gz")
        plain = read_all(root / "plain", "*.tar", max_bytes=1)  # split between every two samples
        gz = read_all(root / "gz", f"*.{suffix}", max_bytes=1)  # one unit, however small the budget
        expected = comparable(plain)
        assert comparable(gz) == [
            [(p[0], p[1], p[2].replace(".tar", f".{suffix}")) if isinstance(p, tuple) else p for p in e]  # type: ignore[union-attr]
            for e in expected
        ]
        assert all(isinstance(i, Document) for i in gz) and len(gz) == len(drawn)
        (layout,) = make_reader("webdataset", "wds", root / "gz", f"*.{suffix}", content="media").layouts()
        assert len(split_file("wds", layout, 1)) == 1 and layout.num_rows == len(drawn)
        chats = [i for i, (_, _, kind) in zip(gz, drawn, strict=True) if kind == "chat"]
        assert all(isinstance(c, Document) and c.trained for c in chats)


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_a_broken_gzipped_shard_is_a_dead_letter(tmp_path: Path, cut: float) -> None:
    write_shard(tmp_path / "whole.tar.gz", members([(0, "a", "txt"), (1, "b", "caption")]), "w:gz")
    data = (tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "whole.tar.gz").unlink()
    (tmp_path / "cut.tar.gz").write_bytes(data[: int(len(data) * cut)])
    (letter,) = read_all(tmp_path, "*.tar.gz")
    assert isinstance(letter, DeadLetter) and letter.location == "cut.tar.gz"
    assert "gzip" in letter.reason or "tar" in letter.reason, letter.reason
