"""Bytes an object-store source reads against the bytes its units need, per format.

    .venv/bin/python -m benchmarks.object_read_bytes_bench [--files 4] [--rows 5000] [--loaders 4] [--markdown]

For Parquet, Arrow IPC, JSONL and text: ``--files`` objects of ``--rows`` documents of 40-120 words (the
columnar formats with a second column of the same size that is not read, in row groups or record batches of
1,000 rows), uploaded to the local object store (versitygw, started here over a scratch folder). One reader plans
them (units of at most 96 KiB of content, several per file), then ``--loaders`` fresh readers, as that many
loader processes, read the units dealt round-robin. Every ranged GET is counted as the store answered it.

What a unit needs: Parquet, its row groups' chunks of the read column, and each object's footer once; Arrow,
its record batches' messages (a batch's columns are stored together and read together), and each object's
schema once; JSONL and text, its byte range. Planning is reported apart: it reads Parquet footers, an Arrow
file whole (the row sizes and where each record batch begins), and a JSONL object over 1 MiB whole (its line
boundaries; a smaller one is planned from the listing alone).

Nothing is asserted: a benchmark prints numbers.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._table import add_markdown_flag, print_table
from benchmarks.object_store_bench import write_corpus
from connectors.planning import split_file
from connectors.readers import Document, make_reader
from connectors.storage import storage_for
from connectors.storage.base import StoredBytes
from connectors.storage.s3 import S3Storage
from connectors.work_units import WorkUnit
from tests.s3_support import S3Server, running_server, upload

FORMATS = ("parquet", "arrow", "jsonl", "text")
UNIT_BYTES = 96 << 10


class GetCounter:
    """Counts every ranged GET of ``S3Storage`` (bytes as answered, and requests) under the current phase."""

    def __init__(self) -> None:
        self.phase = "planning"
        self.counts: Counter[tuple[str, str]] = Counter()
        read_stored = S3Storage.read_stored

        def counted(storage: S3Storage, path: str, start: int, stop: int, etag: str = "") -> StoredBytes:
            stored = read_stored(storage, path, start, stop, etag)
            self.counts[(self.phase, "bytes")] += len(stored.data)
            self.counts[(self.phase, "gets")] += 1
            return stored

        S3Storage.read_stored = counted  # type: ignore[method-assign]


def needed_bytes(file_format: str, local: Path, units: list[WorkUnit]) -> int:
    """What ``units`` need (the module docstring), from the files on disk."""
    if file_format in ("jsonl", "text"):
        return sum(u.estimated_bytes for u in units)
    total = 0
    for path in {u.path for u in units}:
        of_file = [u for u in units if u.path == path]
        pieces, once = parquet_pieces(local / path) if file_format == "parquet" else arrow_pieces(local / path)
        starts = np.cumsum([0, *[rows for rows, _ in pieces]])
        total += once + sum(
            size
            for u in of_file
            for g, (_, size) in enumerate(pieces)
            if starts[g] < u.stop and starts[g + 1] > u.start
        )
    return total


def parquet_pieces(path: Path) -> tuple[list[tuple[int, int]], int]:
    """Each row group's rows and ``text`` column chunk bytes; the footer's bytes."""
    meta = pq.ParquetFile(path).metadata
    groups = [
        (meta.row_group(g).num_rows, meta.row_group(g).column(0).total_compressed_size)
        for g in range(meta.num_row_groups)
    ]
    with path.open("rb") as file:
        file.seek(-8, 2)
        footer = int.from_bytes(file.read(4), "little")
    return groups, footer


def arrow_pieces(path: Path) -> tuple[list[tuple[int, int]], int]:
    """Each record batch's rows and message bytes; the schema message's bytes."""
    with pa.memory_map(str(path)) as source:
        source.seek(8)
        schema = pa.ipc.read_schema(pa.ipc.read_message(source))
        schema_bytes, batches = source.tell() - 8, []
        while True:
            start = source.tell()
            try:
                message = pa.ipc.read_message(source)
            except EOFError:
                return batches, schema_bytes
            batches.append((pa.ipc.read_record_batch(message, schema).num_rows, source.tell() - start))


def measure(server: S3Server, scratch: Path, file_format: str, args: argparse.Namespace, gets: GetCounter) -> list:
    local = write_corpus(scratch / "data", file_format, args.files, args.rows, unread_column=True)
    root = upload(server, local, file_format)
    gets.counts.clear()
    gets.phase = "planning"
    planner = make_reader(file_format, "bench", root, storage=storage_for(root, server.settings()))
    units = [u for layout in planner.layouts() for u in split_file("bench", layout, UNIT_BYTES)]
    gets.phase = "units"
    loaders = [
        make_reader(file_format, "bench", root, storage=storage_for(root, server.settings()))
        for _ in range(args.loaders)
    ]
    documents = sum(isinstance(d, Document) for i, u in enumerate(units) for d in loaders[i % args.loaders].read(u))
    stored = sum(p.stat().st_size for p in local.iterdir())
    needed = needed_bytes(file_format, local, units)
    read = gets.counts[("units", "bytes")]
    return [
        file_format,
        f"{stored:,}",
        f"{len(units)} ({documents:,} docs)",
        f"{gets.counts[('planning', 'bytes')]:,} ({gets.counts[('planning', 'gets')]})",
        f"{needed:,}",
        f"{read:,} ({gets.counts[('units', 'gets')]})",
        f"{read / needed:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=4, help="objects per format")
    parser.add_argument("--rows", type=int, default=5_000, help="documents per object")
    parser.add_argument("--loaders", type=int, default=4, help="readers the units are dealt to")
    parser.add_argument("--formats", default=",".join(FORMATS))
    add_markdown_flag(parser)
    args = parser.parse_args()
    gets = GetCounter()
    with tempfile.TemporaryDirectory(prefix="read-bytes-") as scratch, running_server(Path(scratch) / "s3") as server:
        rows = [measure(server, Path(scratch), f, args, gets) for f in args.formats.split(",")]
    headers = [
        "format",
        "object bytes",
        "units",
        "planning read (GETs)",
        "units need",
        "units read (GETs)",
        "read / need",
    ]
    title = f"{args.files} objects x {args.rows:,} documents a format, units of <= {UNIT_BYTES >> 10} KiB, "
    title += f"{args.loaders} loaders"
    print_table(headers, rows, title=title, markdown=args.markdown)


if __name__ == "__main__":
    main()
