"""A job whose sources are in an object store (versitygw) writes the same steps, byte for byte, as the same
job from local copies of the files; every sample reaches its source topic exactly once."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from connectors.work_units import WorkUnit
from pipeline.spec import load_spec
from tests.loader_support import (
    SOURCES,
    build_example_data,
    committed_sample_ids,
    expected_sample_ids,
    load_sources,
    start_constructor,
    write_spec,
)
from tests.s3_support import S3Server, running_server, storage_section, upload
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end

RANKS = 2
STEP = {"ranks": RANKS, "micro_batches": 2, "tokens_per_micro_batch": 1024}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


def object_store_spec(local: Path, folder: Path, server: S3Server, prefix: str, job: str) -> Path:
    """``local``'s spec with each source's path in the bucket and the storage section that reaches it, the
    keys named by environment variables (set here for the loader processes)."""
    os.environ["MIXFLOW_TEST_S3_KEY"], os.environ["MIXFLOW_TEST_S3_SECRET"] = server.access_key, server.secret_key
    body = yaml.safe_load(local.read_text())
    body["job"] = job
    for source in body["sources"]:
        source["path"] = f"s3://corpus/{prefix}/{source['name']}"
    body["storage"] = storage_section(server, retry_deadline_s=30)
    path = folder / "s3-spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def construct(spec: Path, out: str) -> None:
    process = start_constructor(spec, out)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr.decode()[-3000:]


def work_units(bootstrap: str, job: str, source: str) -> list[WorkUnit]:
    """The source's plan, in work-topic order, without the objects' pins."""
    records = read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).work(source))
    units = [dataclasses.replace(WorkUnit.from_json(m.value()), etag="", object_size=0) for m in records]
    return [dataclasses.replace(u, stop=0) if u.kind == "file" else u for u in units]


def rank_values(bootstrap: str, job: str) -> list[list[bytes]]:
    config = {"bootstrap.servers": bootstrap}
    return [[m.value() for m in read_to_end(config, JobTopics(job).rank(r))] for r in range(RANKS)]


def load_both(bootstrap: str, server: S3Server, data: Path, folder: Path) -> tuple[str, str]:
    """Load ``data`` (the example's three sources) as two jobs, from local disk and from the bucket, and
    construct each; the two job names (local, object store)."""
    name = f"s3job{random.randrange(16**8):08x}"
    for source in SOURCES:
        upload(server, data / source, f"{name}/{source}")
    local = write_spec(folder, f"{name}l", bootstrap, data, on_exhausted="renormalize", step=STEP)
    remote = object_store_spec(local, folder, server, name, f"{name}r")
    for spec in (local, remote):
        load_sources(spec, folder)
        construct(spec, f"{load_spec(spec).job}-out")
    remote_spec = load_spec(remote)
    for source in SOURCES:
        ids = committed_sample_ids(bootstrap, JobTopics(remote_spec.job), source)
        assert Counter(ids) == expected_sample_ids(remote_spec, bootstrap, source)
        assert set(Counter(ids).values()) == {1}, f"{source}: a sample committed twice"
    return f"{name}l", f"{name}r"


def samples_by_id(bootstrap: str, job: str, source: str) -> dict[bytes, bytes]:
    return {m.key(): m.value() for m in read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).src(source))}


@pytest.mark.kafka
def test_the_object_store_plans_the_same_units_and_makes_the_same_samples(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path
) -> None:
    """The example's sources, many files each: the same plan (but for the objects' pins, and the row count
    of a small JSONL object planned from the listing) and every sample's record the same bytes. (Which unit
    a loader takes first among the work topic's partitions varies from run to run, from disk too.)"""
    data = build_example_data(tmp_path / "data", limit=30)
    local, remote = load_both(kafka_bootstrap, server, data, tmp_path)
    for source in SOURCES:
        assert work_units(kafka_bootstrap, remote, source) == work_units(kafka_bootstrap, local, source)
        by_id = samples_by_id(kafka_bootstrap, remote, source)
        assert by_id and by_id == samples_by_id(kafka_bootstrap, local, source)


@pytest.mark.kafka
def test_a_job_from_the_object_store_writes_the_steps_of_local_copies(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path
) -> None:
    """One file per source, so each source is one unit and its samples' order is the file's: the steps are
    the same, byte for byte."""
    example = build_example_data(tmp_path / "example", limit=30)
    data = tmp_path / "data"
    for source in SOURCES:
        first = sorted(p for p in (example / source).rglob("*") if p.is_file())[0]
        (data / source).mkdir(parents=True)
        shutil.copy(first, data / source / first.name)
    shutil.copy(example / "tokenizer.json", data / "tokenizer.json")
    local, remote = load_both(kafka_bootstrap, server, data, tmp_path)
    local_steps = rank_values(kafka_bootstrap, f"{local}-out")
    assert all(local_steps)
    assert rank_values(kafka_bootstrap, f"{remote}-out") == local_steps
