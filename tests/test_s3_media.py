"""A multimodal JSONL source in an object store whose images are objects named relative to the source root:
the same samples (tokens and media) as from the same files on disk, and the same dead letters."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import ByteLevelBPETokenizer

from connectors.planning import split_file
from connectors.readers import Document, make_reader
from connectors.samples import SampleBuilder
from connectors.storage import storage_for
from connectors.tokenizer import TextTokenizer
from tests.media_support import VISION, image_bytes, text_image
from tests.s3_support import running_server, upload


def build(reader, media_root, tokenizer: TextTokenizer) -> tuple[list, list[str]]:
    builder = SampleBuilder(tokenizer, max_length=4096, vision=VISION, max_patches=256, media_root=media_root)
    units = [u for layout in reader.layouts() for u in split_file(reader.source, layout, 1 << 30)]
    items = [item for unit in units for item in reader.read(unit)]
    built = builder.build([i for i in items if isinstance(i, Document)])
    samples = [(s.sample_id, s.tokens.tolist(), list(s.media or ())) for s in built.samples]
    letters = [i.location for i in items if not isinstance(i, Document)] + [d.location for d in built.dead_letters]
    return samples, sorted(letters)


def test_images_named_by_path_are_read_from_the_bucket(tmp_path: Path) -> None:
    folder = tmp_path / "mm"
    (folder / "imgs").mkdir(parents=True)
    for name, size in (("a.png", (56, 84)), ("b.png", (112, 56))):
        (folder / "imgs" / name).write_bytes(image_bytes(text_image(*size)))
    rows = [
        {"image": "imgs/a.png", "text": "first caption"},
        {"images": ["imgs/b.png", "imgs/a.png"], "text": "two images"},
        {"image": "imgs/missing.png", "text": "no such image"},
        {"image": "../outside.png", "text": "outside the root"},
    ]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([r["text"] for r in rows] * 5, vocab_size=300, special_tokens=["<eod>"])
    trainer.save(str(tmp_path / "tokenizer.json"))
    tokenizer = TextTokenizer.from_file(tmp_path / "tokenizer.json")
    with running_server(tmp_path / "s3") as server:
        root = upload(server, folder, "mm")
        storage = storage_for(root, server.settings())
        remote = make_reader("jsonl", "mm", root, "rows.jsonl", content="media", storage=storage)
        local = make_reader("jsonl", "mm", folder, "rows.jsonl", content="media")
        got, got_letters = build(remote, storage, tokenizer)
        expected, expected_letters = build(local, folder, tokenizer)
    assert [s[0] for s in expected] == ["mm/rows.jsonl/0", "mm/rows.jsonl/1"]
    assert got == expected
    assert got_letters == expected_letters and len(expected_letters) == 2
