"""Sources in an object store (versitygw, started here over a scratch folder) against the same files on disk.

    .venv/bin/python -m benchmarks.object_store_bench [--repeats 3] [--objects 100000] [--planning-only]
        [--markdown] [--bootstrap-servers 127.0.0.1:9092]

1. Loader tokens/s: for Parquet and JSONL, one ``mixflow load --until-drained`` process over the files on local
   disk and one over the same files in the bucket, alternately, ``--repeats`` times each, in fresh jobs; the
   loader's own ``tokens_per_second`` (its JSON summary: tokens over its seconds after planning). Medians and
   their ratio (object store over disk; target >= 0.8).
2. Reading against plain boto3: every unit of the same plan read to documents by the mixflow reader from the
   bucket, against plain boto3 range GETs of the same bytes (a JSONL unit's byte range; a Parquet footer and
   the row group's column chunks) decoded the same way (json.loads per line; pyarrow's ``read_row_group``
   over a buffer holding just those ranges). Medians of ``--repeats``; ratio of rates (target >= 0.8).
3. Planning a prefix of ``--objects`` small JSONL objects: the objects are written into the server's folder
   with the ETag attribute a PUT leaves (that many PUTs would take minutes), then a fresh process lists and
   plans them as loader instance 0 does; its wall time and peak RSS. ``--planning-only`` runs this part alone.
4. Time to first sample: from starting a loader process to the first sample in the source topic, for the
   JSONL source from the bucket and from disk.
5. Many small objects: ``--small`` JSONL objects of 5-40 documents each (2-20 KB), loader tokens/s from the
   bucket against disk as in 1 (medians of ``--repeats``; target >= 0.8). ``--small-only`` runs this part alone.

Nothing is asserted: a benchmark prints numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks._table import add_markdown_flag, print_table
from connectors.planning import split_file
from connectors.readers import Document, Reader, make_reader
from connectors.storage import storage_for
from connectors.storage.s3 import S3Storage
from connectors.work_units import WorkUnit
from tests.kafka_support import TopicGrowth
from tests.loader_support import build_example_data
from tests.s3_support import S3Server, running_server, upload
from topics.formats.names import JobTopics
from topics.kafka.admin import delete_job_topics

REPO = Path(__file__).resolve().parent.parent
GROUP_ROWS = 1_000
WORDS = [
    "def",
    "return",
    "value",
    "the",
    "list",
    "of",
    "items",
    "index",
    "error",
    "string",
    "number",
    "class",
    "import",
    "self",
    "data",
    "for",
    "in",
]


def write_corpus(folder: Path, file_format: str, files: int, rows: int, *, unread_column: bool = False) -> Path:
    """``files`` files of ``rows`` documents of 40-120 words each in ``file_format`` (parquet, arrow, jsonl or
    text; Parquet in row groups and Arrow in record batches of 1,000); ``unread_column``: the columnar formats
    with a second column as large as ``text``, which a source reading ``text`` does not read."""
    rng = np.random.default_rng(7)
    out = folder / file_format
    out.mkdir(parents=True)
    suffix = {"text": "txt"}.get(file_format, file_format)
    for f in range(files):
        texts = [" ".join(rng.choice(WORDS, int(rng.integers(40, 120)))) for _ in range(rows)]
        table = pa.table({"text": texts, **({"other": [t.upper() for t in texts]} if unread_column else {})})
        path = out / f"part-{f:03d}.{suffix}"
        if file_format == "parquet":
            pq.write_table(table, path, row_group_size=GROUP_ROWS)
        elif file_format == "arrow":
            with pa.ipc.new_file(path, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=GROUP_ROWS):
                    writer.write_batch(batch)
        elif file_format == "jsonl":
            path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        else:
            path.write_text("\n".join(texts) + "\n")
    return out


def write_spec(folder: Path, job: str, bootstrap: str, source: dict, tokenizer: Path, server: S3Server) -> Path:
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(tokenizer),
        "sources": [{"max_sample_length": 1024, "eod_token_id": 0, **source}],
        "mixture": {"weights": {source["name"]: 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 100.0},
    }
    if str(source["path"]).startswith("s3://"):
        spec["storage"] = {
            "endpoint_url": server.endpoint,
            "region": "us-east-1",
            "addressing_style": "path",
            "credentials": {"access_key_id": {"env": "BENCH_S3_KEY"}, "secret_access_key": {"env": "BENCH_S3_SECRET"}},
        }
    path = folder / f"{job}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def loader_rate(spec: Path, source: str, bootstrap: str) -> tuple[float, float, float]:
    """One loader over the spec's source in a fresh job: (tokens/s, seconds to its first sample, tokens per
    second in its transactions: the loading alone, without its wait to join its group and take units)."""
    job = yaml.safe_load(spec.read_text())["job"]
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec), "--source", source, "--until-drained"]
    growth = TopicGrowth(bootstrap, [JobTopics(job).src(source)])
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    first = float("nan")
    while process.poll() is None and growth.records() == 0:
        time.sleep(0.01)  # polling a high watermark
    first = time.perf_counter() - began
    out, _ = process.communicate(timeout=1200)
    delete_job_topics(bootstrap, job)
    if process.returncode != 0:
        raise RuntimeError(f"loader over {spec} exited {process.returncode}")
    summary = json.loads(out.decode().strip().splitlines()[-1])
    return float(summary["tokens_per_second"]), first, summary["tokens"] / summary["busy_seconds"]


def get_range(client: Any, bucket: str, key: str, start: int, stop: int) -> bytes:
    return client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}")["Body"].read()


def jsonl_baseline(reader: Reader, client: Any, bucket: str, key: str, unit: WorkUnit) -> int:
    """A JSONL unit by one plain range GET of its bytes, each line parsed into a document: the documents."""
    data = get_range(client, bucket, key, unit.byte_offset, unit.byte_offset + unit.estimated_bytes)
    lines = [line for line in data.splitlines() if line.strip()]
    return sum(
        isinstance(reader.document(unit.path, r, json.loads(line)["text"]), Document) for r, line in enumerate(lines)
    )


def parquet_baseline(reader: Reader, client: Any, bucket: str, key: str, unit: WorkUnit) -> int:
    """A Parquet row group by plain range GETs of the footer and its column chunk, decoded by pyarrow from a
    buffer holding only those ranges, each value made a document: the documents."""
    size, group = unit.object_size, unit.row_group or 0
    buffer = bytearray(size)
    tail = get_range(client, bucket, key, max(size - 65536, 0), size)
    buffer[size - len(tail) :] = tail
    meta = pq.ParquetFile(pa.BufferReader(bytes(buffer))).metadata
    column = meta.row_group(group).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    stop = start + column.total_compressed_size
    buffer[start:stop] = get_range(client, bucket, key, start, stop)
    table = pq.ParquetFile(pa.BufferReader(bytes(buffer))).read_row_group(group, columns=["text"])
    values = table.column("text").to_pylist()
    return sum(isinstance(reader.document(unit.path, r, v), Document) for r, v in enumerate(values))


def reading_rates(server: S3Server, root: str, file_format: str, repeats: int) -> tuple[float, float]:
    """Median seconds to read every unit: (mixflow reader from the bucket, plain boto3 of the same ranges)."""
    reader = make_reader(file_format, "bench", root, storage=storage_for(root, server.settings()))
    units = [u for layout in reader.layouts() for u in split_file("bench", layout, 256 << 10)]
    client = S3Storage(root, server.settings()).client
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    ours, plain = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        count = sum(isinstance(d, Document) for unit in units for d in reader.read(unit))
        ours.append(time.perf_counter() - began)
        began = time.perf_counter()
        baseline = jsonl_baseline if file_format == "jsonl" else parquet_baseline
        check = sum(baseline(reader, client, bucket, f"{prefix}/{u.path}", u) for u in units)
        plain.append(time.perf_counter() - began)
        assert check == count, (check, count)
    return statistics.median(ours), statistics.median(plain)


def write_small_objects(folder: Path, count: int) -> Path:
    """``count`` JSONL files of 5-40 documents of 40-120 words each, in 10 sub-folders."""
    rng = np.random.default_rng(11)
    out = folder / "small"
    for i in range(count):
        texts = [" ".join(rng.choice(WORDS, int(rng.integers(40, 120)))) for _ in range(int(rng.integers(5, 41)))]
        path = out / f"{i % 10:02d}" / f"doc-{i:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return out


def loader_rates(
    folder: Path, server: S3Server, args: argparse.Namespace, tokenizer: Path, local: Path, root: str, file_format: str
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Loader tokens/s and seconds to the first sample over ``local`` and over ``root``, alternately, in fresh
    jobs, ``args.repeats`` times each."""
    rates: dict[str, list[float]] = {"disk": [], "bucket": [], "disk busy": [], "bucket busy": []}
    firsts: dict[str, list[float]] = {"disk": [], "bucket": []}
    for _ in range(args.repeats):
        for where, path in (("disk", str(local)), ("bucket", root)):
            job = f"osb{uuid.uuid4().hex[:8]}"
            source = {"name": "bench", "reader": file_format, "path": path}
            spec = write_spec(folder, job, args.bootstrap_servers, source, tokenizer, server)
            rate, first, busy = loader_rate(spec, "bench", args.bootstrap_servers)
            rates[where].append(rate)
            rates[f"{where} busy"].append(busy)
            firsts[where].append(first)
    return rates, firsts


def many_objects(server: S3Server, count: int) -> str:
    """``count`` small JSONL objects under one prefix, written into the server's folder with their ETags."""
    folder = server.bucket("many") / "small"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        body = (json.dumps({"text": f"object {i} " + "w" * (i % 200)}) + "\n").encode()
        path = folder / f"{i // 1000:03d}" / f"obj-{i:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(body)
        os.setxattr(path, "user.etag", f'"{hashlib.md5(body).hexdigest()}"'.encode())
    return "s3://many/small"


PLAN_CHILD = """
import json, resource, sys, time
from connectors.planning import plan_units
from connectors.readers import make_reader
from connectors.storage import storage_for
from pathlib import Path
from tests.s3_support import S3Server
server = S3Server(Path(sys.argv[3]), int(sys.argv[2]))
root = sys.argv[1]
began = time.perf_counter()
reader = make_reader("jsonl", "many", root, storage=storage_for(root, server.settings()))
layouts = reader.layouts()
listed = time.perf_counter() - began
units = plan_units(reader, 1e-6, 0.5, layouts=layouts, seed=1)
print(json.dumps({"objects": len(layouts), "units": len(units), "list_s": listed,
    "plan_s": time.perf_counter() - began, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def planning(server: S3Server, root: str) -> dict[str, float]:
    command = [sys.executable, "-c", PLAN_CHILD, root, str(server.port), str(server.store.state_dir)]
    out = subprocess.run(command, check=True, capture_output=True, cwd=REPO, timeout=1200).stdout
    return json.loads(out.decode().strip().splitlines()[-1])


def plan_many(server: S3Server, objects: int, markdown: bool) -> None:
    """Part 3: write ``objects`` small objects, plan them in a fresh process, print the table."""
    began = time.perf_counter()
    root = many_objects(server, objects)
    made = time.perf_counter() - began
    plan = planning(server, root)
    rows = [
        [
            plan["objects"],
            plan["units"],
            f"{plan['list_s']:.1f}",
            f"{plan['plan_s']:.1f}",
            f"{plan['rss_mib']:.0f}",
        ]
    ]
    print_table(
        ["objects", "units", "list+layouts s", "plan s", "peak RSS MiB"],
        rows,
        title=f"planning a prefix of small JSONL objects (written in {made:.0f} s)",
        markdown=markdown,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--planning-only", action="store_true", help="only plan the prefix of --objects")
    parser.add_argument("--small", type=int, default=250, help="small JSONL objects read by a loader (0: none)")
    parser.add_argument("--small-only", action="store_true", help="only the loader over --small small objects")
    parser.add_argument("--files", type=int, default=6, help="files per format")
    parser.add_argument("--rows", type=int, default=5_000, help="documents per file")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    add_markdown_flag(parser)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="objstore-bench-") as scratch,
        running_server(Path(scratch) / "s3") as server,
    ):
        os.environ["BENCH_S3_KEY"], os.environ["BENCH_S3_SECRET"] = server.access_key, server.secret_key
        folder = Path(scratch)
        tokenizer = build_example_data(folder / "example", limit=3) / "tokenizer.json"
        loader_rows, reading_rows, first_rows = [], [], []
        formats = () if args.planning_only or args.small_only else ("parquet", "jsonl")
        for file_format in formats:
            local = write_corpus(folder / "data", file_format, args.files, args.rows)
            root = upload(server, local, file_format)
            rates, firsts = loader_rates(folder, server, args, tokenizer, local, root, file_format)
            disk, bucket = statistics.median(rates["disk"]), statistics.median(rates["bucket"])
            loader_rows.append([file_format, f"{disk:,.0f}", f"{bucket:,.0f}", f"{bucket / disk:.2f}"])
            first_rows.append(
                [file_format, f"{statistics.median(firsts['disk']):.2f}", f"{statistics.median(firsts['bucket']):.2f}"]
            )
            ours, plain = reading_rates(server, root, file_format, args.repeats)
            reading_rows.append([file_format, f"{ours:.3f}", f"{plain:.3f}", f"{plain / ours:.2f}"])
        if args.small and not args.planning_only:
            local = write_small_objects(folder / "data", args.small)
            rates, _ = loader_rates(folder, server, args, tokenizer, local, upload(server, local, "small"), "jsonl")
            median = {where: statistics.median(values) for where, values in rates.items()}
            print_table(
                ["objects", "disk", "bucket", "bucket/disk", "loading alone: disk", "bucket", "bucket/disk"],
                [
                    [
                        args.small,
                        f"{median['disk']:,.0f}",
                        f"{median['bucket']:,.0f}",
                        f"{median['bucket'] / median['disk']:.2f}",
                        f"{median['disk busy']:,.0f}",
                        f"{median['bucket busy']:,.0f}",
                        f"{median['bucket busy'] / median['disk busy']:.2f}",
                    ]
                ],
                title=f"loader tokens/s over many small JSONL objects, median of {args.repeats}",
                markdown=args.markdown,
            )
        if args.planning_only:
            plan_many(server, args.objects, args.markdown)
            return
        if args.small_only:
            return
        title = f"loader tokens/s, median of {args.repeats}, {args.files} files x {args.rows} documents per format"
        print_table(["format", "disk", "bucket", "bucket/disk"], loader_rows, title=title, markdown=args.markdown)
        print_table(
            ["format", "mixflow reader s", "plain boto3 s", "rate ratio"],
            reading_rows,
            title="reading every unit from the bucket: mixflow reader against plain boto3 range GETs, same decoding",
            markdown=args.markdown,
        )
        print_table(
            ["format", "disk s", "bucket s"],
            first_rows,
            title="time to first sample (loader start to first record)",
            markdown=args.markdown,
        )
        if args.objects:
            plan_many(server, args.objects, args.markdown)


if __name__ == "__main__":
    main()
