"""Compressed sources against the same JSON lines plain: what planning (finding lines and frames), reading and
tokenizing cost, in one process, on a corpus of random words.

    .venv/bin/python -m benchmarks.compressed_bench [--mb 48] [--frame-mb 1] [--unit-mb 4] [--repeats 3] [--markdown]

Forms: the plain file (the baseline), one gzip stream, gzip members of --frame-mb of data each (cut wherever the
count falls, as bgzip cuts), one zstd frame, and zstd frames of --frame-mb. For each: its stored size; planning
(``JsonlReader.layout``: a plain file's newlines, a compressed one decoded once) in decompressed MB/s; the units
``split_file`` makes at --unit-mb; reading every unit (``Reader.read``: decoding, lines, JSON); reading and
tokenizing (``SampleBuilder.build``, a word-level tokenizer). CPU seconds of the process (the tokenizer's threads
included), the fewest of --repeats; files in the page cache (a first read before the timed ones).
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zstandard

from benchmarks._table import add_markdown_flag, print_table
from connectors.planning import split_file
from connectors.readers import Document, JsonlReader
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer

WORDS = 500


def corpus(megabytes: float) -> bytes:
    rng = np.random.default_rng(0)
    lines, size = [], 0
    while size < megabytes * 1e6:
        words = " ".join(f"w{w}" for w in rng.integers(0, WORDS, int(rng.integers(20, 600))))
        lines.append(json.dumps({"text": words}).encode() + b"\n")
        size += len(lines[-1])
    return b"".join(lines)


def forms(data: bytes, frame_bytes: int) -> dict[str, tuple[str, bytes]]:
    """Each form's file name and bytes."""
    frames = [data[i : i + frame_bytes] for i in range(0, len(data), frame_bytes)]
    zstd = zstandard.ZstdCompressor(level=3)
    return {
        "plain": ("rows.jsonl", data),
        "gzip, one stream": ("one.jsonl.gz", gzip.compress(data, 6, mtime=0)),
        "gzip members": ("members.jsonl.gz", b"".join(gzip.compress(f, 6, mtime=0) for f in frames)),
        "zstd, one frame": ("one.jsonl.zst", zstd.compress(data)),
        "zstd frames": ("frames.jsonl.zst", b"".join(zstd.compress(f) for f in frames)),
    }


def word_tokenizer() -> TextTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i + 1 for i in range(WORDS)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return TextTokenizer(tokenizer)


def fastest(run: Callable[[], object], repeats: int) -> float:
    """The fewest CPU seconds of the process (every thread) that ``run`` took, of ``repeats`` runs: on a shared
    machine the wall time of a run waiting for a core says more about the others than about it."""
    best = float("inf")
    for _ in range(repeats):
        began = time.process_time()
        run()
        best = min(best, time.process_time() - began)
    return best


def measure(folder: Path, name: str, unit_bytes: int, builder: SampleBuilder, repeats: int) -> dict[str, float]:
    reader = JsonlReader("bench", folder)
    layout = reader.layout(name)
    units = split_file("bench", layout, unit_bytes)

    def read() -> list[Document]:
        return [item for unit in units for item in reader.read(unit) if isinstance(item, Document)]

    documents = read()
    return {
        "rows": len(documents),
        "units": len(units),
        "plan_s": fastest(lambda: reader.layout(name), repeats),
        "read_s": fastest(read, repeats),
        "tokenize_s": fastest(lambda: builder.build(read()), repeats),
        "content": layout.content_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=48.0, help="JSON lines, in MB")
    parser.add_argument("--frame-mb", type=float, default=1.0, help="data per gzip member or zstd frame")
    parser.add_argument("--unit-mb", type=float, default=4.0, help="the units' target, decompressed")
    parser.add_argument("--repeats", type=int, default=3)
    add_markdown_flag(parser)
    args = parser.parse_args()
    data = corpus(args.mb)
    builder = SampleBuilder(word_tokenizer(), max_length=4096)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = forms(data, int(args.frame_mb * 1e6))
        for name, body in files.values():
            (folder / name).write_bytes(body)
        for form, (name, _) in files.items():
            results[form] = measure(folder, name, int(args.unit_mb * 1e6), builder, args.repeats)
    plain = results["plain"]
    assert all(r["rows"] == plain["rows"] for r in results.values()), "a form read other rows than the plain file"
    rows = []
    for form, r in results.items():
        stored = len(files[form][1])
        rows.append(
            [
                form,
                f"{stored / 1e6:.1f}",
                f"{r['units']:.0f}",
                f"{r['plan_s']:.2f}",
                f"{r['content'] / r['plan_s'] / 1e6:.0f}",
                f"{r['read_s']:.2f}",
                f"{r['read_s'] / plain['read_s']:.2f}",
                f"{r['tokenize_s']:.2f}",
                f"{r['tokenize_s'] / plain['tokenize_s']:.2f}",
            ]
        )
    print(f"{len(data) / 1e6:.1f} MB of JSON lines, {plain['rows']:.0f} rows; units of {args.unit_mb} MB")
    headers = [
        "form",
        "stored MB",
        "units",
        "plan CPU s",
        "plan MB/s",
        "read CPU s",
        "/ plain",
        "read+tok CPU s",
        "/ plain",
    ]
    print_table(headers, rows, markdown=args.markdown)


if __name__ == "__main__":
    main()
