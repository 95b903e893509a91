"""benchmarks/object_read_bytes_bench.py on a small corpus: each format's units read at most 1.2x the bytes they
need (Parquet column chunks and footers, Arrow record batches and schemas, JSONL and text byte ranges)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.s3_support import running_server

REPO = Path(__file__).resolve().parent.parent


def test_every_format_reads_at_most_a_fifth_more_than_its_units_need(tmp_path: Path) -> None:
    with running_server(tmp_path / "s3"):  # skips where no object store can be built; the benchmark starts its own
        pass
    command = [sys.executable, "-m", "benchmarks.object_read_bytes_bench", "--files", "2", "--rows", "3000"]
    command += ["--loaders", "3", "--markdown"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"\| (parquet|arrow|jsonl|text) ", line)]
    ratios = {row.split("|")[1].strip(): float(row.split("|")[-2]) for row in rows}
    assert set(ratios) == {"parquet", "arrow", "jsonl", "text"}, done.stdout
    assert all(1.0 <= ratio <= 1.2 for ratio in ratios.values()), done.stdout
