"""OBELICS' interleaved documents: ``images`` and ``texts`` lists of one length, null where the other holds an
item, in Parquet as the dataset ships and in JSON Lines."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import matplotlib.cbook
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import Document, MediaRef, make_reader
from topics.formats.dead_letter import DeadLetter

IMAGES = ("grace_hopper.jpg", "logo2.png")
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def sample_image(name: str) -> bytes:
    with matplotlib.cbook.get_sample_data(name) as file:
        return file.read()


def read_all(reader_name: str, root: Path) -> list[Document | DeadLetter]:
    reader = make_reader(reader_name, "obelics", root, content="media")
    return [
        item
        for layout in reader.layouts()
        for unit in split_file("obelics", layout, 1 << 40)
        for item in reader.read(unit)
    ]


def comparable(parts: tuple[object, ...]) -> list[object]:
    return [(p.kind, p.data if p.data is not None else p.path) if isinstance(p, MediaRef) else p for p in parts]


# a document: positions, each a text or an image (index into IMAGES)
positions = st.lists(st.one_of(st.text(min_size=1, max_size=6), st.sampled_from(range(len(IMAGES)))), max_size=6)
documents = positions.filter(lambda d: any(isinstance(p, str) for p in d) and any(isinstance(p, int) for p in d))


@settings(max_examples=25, deadline=None)
@given(st.lists(documents, min_size=1, max_size=4), st.booleans())
def test_obelics_parquet_and_jsonl(docs: list[list[str | int]], as_bytes: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name in IMAGES:
            (root / name).write_bytes(sample_image(name))
        meta = json.dumps({"url": "https://example.com/page"})

        def image(p: int) -> object:
            return {"bytes": sample_image(IMAGES[p]), "path": None} if as_bytes else IMAGES[p]

        images = [[None if isinstance(p, str) else image(p) for p in doc] for doc in docs]
        texts = [[p if isinstance(p, str) else None for p in doc] for doc in docs]
        image_type = pa.list_(IMAGE_STRUCT if as_bytes else pa.string())
        columns = {
            "images": pa.array(images, image_type),
            "metadata": [meta] * len(docs),
            "general_metadata": [meta] * len(docs),
            "texts": texts,
        }
        pq.write_table(pa.table(columns), root / "train-00000-of-00001.parquet")
        expected = [
            [(("image", sample_image(IMAGES[p]) if as_bytes else IMAGES[p]) if isinstance(p, int) else p) for p in doc]
            for doc in docs
        ]
        read = read_all("parquet", root)
        assert [comparable(d.parts) for d in read if isinstance(d, Document)] == expected  # type: ignore[arg-type]
        if not as_bytes:
            (root / "train-00000-of-00001.parquet").unlink()
            rows = [{"images": i, "texts": t, "metadata": meta} for i, t in zip(images, texts, strict=True)]
            (root / "obelics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            read = read_all("jsonl", root)
            assert [comparable(d.parts) for d in read if isinstance(d, Document)] == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (
            {"images": [None, "a.jpg"], "texts": ["x"]},
            "texts and images must be lists of one length, not a list of 1 and a list of 2",
        ),
        (
            {"images": ["a.jpg", None], "texts": ["x", None]},
            "position 0 of texts and images holds both a text and an image",
        ),
        (
            {"images": [None, None], "texts": ["x", None]},
            "position 1 of texts and images holds neither a text nor an image",
        ),
        (
            {"images": [None, "https://x.org/a.jpg"], "texts": ["x", None]},
            "image 0: path 'https://x.org/a.jpg' is a URL; media are read from the source, never fetched",
        ),
        ({"images": [None], "texts": ["x"]}, "no image or video"),
        ({"texts": ["x"]}, "texts and images must be lists of one length, not a list of 1 and a NoneType"),
    ],
)
def test_obelics_bad_records(tmp_path: Path, record: dict[str, object], reason: str) -> None:
    (tmp_path / "o.jsonl").write_text(json.dumps(record) + "\n")
    (letter,) = read_all("jsonl", tmp_path)
    assert isinstance(letter, DeadLetter) and (letter.location, letter.reason) == ("o.jsonl:row=0", reason)
