"""``storage.on_changed_object``: an object changed or vanished since planning is a dead letter and the job goes
on (``dead_letter``, the default: ``test_s3_faults``), or, with ``stop``, the loader publishes nothing of its
unit and exits with code 5 and one line naming the source, the object, the reason and what to do; restoring
the object and starting the loader again finishes the job with every sample once. Against a real S3 server."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from connectors import Document, WorkUnit
from connectors.readers import make_reader
from connectors.storage import ObjectChangedError, ObjectMissingError, ObjectRefusedError
from connectors.storage.s3 import S3Storage
from pipeline.kafka.work_plan import publish_work_plan
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import load_spec
from pipeline.spec.storage import StorageSpec
from pipeline.tools.run.job import _start, _wait
from tests.loader_support import (
    build_example_data,
    committed_sample_ids,
    dead_letters,
    start_loader,
    wait_all,
    write_spec,
)
from tests.s3_support import S3Server, running_server, upload
from tests.test_s3_job import object_store_spec
from tests.test_s3_readers import write_source
from topics.errors import RefusedError
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics


@pytest.fixture
def server(tmp_path: Path) -> Iterator[S3Server]:
    with running_server(tmp_path / "s3") as running:
        yield running


def test_the_default_is_dead_letter() -> None:
    assert StorageSpec().on_changed_object == "dead_letter"
    assert StorageSpec(on_changed_object="stop").on_changed_object == "stop"


@given(st.text(max_size=12).filter(lambda value: value not in ("dead_letter", "stop")))
def test_any_other_policy_is_a_spec_error(value: str) -> None:
    with pytest.raises(ValidationError, match="on_changed_object"):
        StorageSpec(on_changed_object=value)


@pytest.mark.parametrize("stop", [False, True])
def test_a_pinned_read_of_a_changed_or_vanished_object_is_refused_per_the_policy(
    server: S3Server, tmp_path: Path, stop: bool
) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.txt").write_text("planned version\n")
    root = upload(server, folder, "policy")
    storage = S3Storage(root, server.settings(stop_on_changed=stop))
    planned = storage.info("a.txt")
    storage.client.put_object(Bucket="corpus", Key="policy/a.txt", Body=b"another version\n")
    expected = ObjectRefusedError if stop else ObjectChangedError
    with pytest.raises(expected, match=r"s3://corpus/policy/a\.txt: changed since planning"):
        storage.read_range("a.txt", 0, 4, planned.etag)
    with pytest.raises(expected, match="changed since planning"):
        storage.open("a.txt", planned.etag).read()
    assert storage.read_range("a.txt", 0, 7) == b"another"  # a read of any version is not refused
    storage.client.delete_object(Bucket="corpus", Key="policy/a.txt")
    expected = ObjectRefusedError if stop else ObjectMissingError
    with pytest.raises(expected, match=r"s3://corpus/policy/a\.txt: no such object"):
        storage.read_range("a.txt", 0, 4, planned.etag)
    with pytest.raises(expected, match="no such object"):
        storage.open("a.txt", planned.etag).read()
    with pytest.raises(ObjectMissingError):  # unpinned: a reader's dead letter whatever the policy
        storage.info("a.txt")
    assert issubclass(ObjectRefusedError, RefusedError) and not issubclass(ObjectRefusedError, OSError)


def test_with_stop_an_object_changed_while_it_is_planned_stops_the_planner(server: S3Server, tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write_source(folder, "parquet", [20])
    root = upload(server, folder, "planning")
    reader = make_reader("parquet", "web", root, storage=S3Storage(root, server.settings(stop_on_changed=True)))
    [listed] = reader.files()
    reader.storage.client.put_object(Bucket="corpus", Key=f"planning/{listed}", Body=b"not the listed version")
    reader.files = lambda: [listed]  # type: ignore[method-assign]  # changed between the listing and its layout
    runtime = SourceRuntime(SimpleNamespace(name="web", epochs=1), reader, builder=None)  # type: ignore[arg-type]
    with pytest.raises(RefusedError, match=rf"source web: planning: s3://corpus/planning/{listed}: changed since"):
        runtime.plan(seed=0, cost_per_byte=1e-9)


def test_mixflow_run_does_not_restart_a_refused_role(tmp_path: Path) -> None:
    line = "mixflow load: error: source topics: unit u: s3://corpus/t/a: changed since planning"
    role = _start("loader-topics-0", tmp_path, [sys.executable, "-c", f"print({line!r}); raise SystemExit(5)"])
    with pytest.raises(RefusedError) as info:
        _wait([role], None)
    assert str(info.value) == f"loader-topics-0 was refused and is not started again: {line.split(': error: ')[1]}"
    assert role.restarts == 0 and role.restart_at is None


def unit_sample_ids(runtime: SourceRuntime, unit: WorkUnit) -> list[str]:
    documents = [d for d in runtime.reader.read(unit) if isinstance(d, Document)]
    return [s.sample_id for s in runtime.builder.build(documents, epoch=unit.epoch).samples]


@pytest.mark.kafka
@pytest.mark.parametrize(("change", "reason"), [("overwrite", "changed since planning"), ("delete", "no such object")])
def test_with_stop_a_changed_object_stops_the_loader_and_publishes_nothing_of_its_unit(
    kafka_bootstrap: str, server: S3Server, tmp_path: Path, unique_name: str, change: str, reason: str
) -> None:
    """The plan in one work partition, so that the units before the changed one (the last) come first, each
    in its own transaction: those committed stay so, once; restoring the object (its planned bytes, so its
    planned ETag) and starting the loader again finishes the job with every sample once."""
    data = build_example_data(tmp_path / "data", limit=30)
    upload(server, data / "topics", f"{unique_name}/topics")
    spec = object_store_spec(
        write_spec(tmp_path, unique_name, kafka_bootstrap, data), tmp_path, server, unique_name, unique_name
    )
    body = yaml.safe_load(spec.read_text())
    body["storage"]["on_changed_object"] = "stop"
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    job = load_spec(spec)
    config = {"bootstrap.servers": kafka_bootstrap}
    topics = JobTopics(unique_name)
    ensure_job_topics(config, unique_name, job.source_names, job.step.ranks)
    runtime = SourceRuntime.from_spec(job, "topics")
    units = runtime.plan(job.seed)
    assert len(units) > 1, "the test needs units before the changed one"
    publish_work_plan(config, topics, "topics", units, 1)
    per_unit = {unit.unit_id: unit_sample_ids(runtime, unit) for unit in units}
    changed = units[-1]
    key = f"{unique_name}/topics/{changed.path}"
    client = S3Storage("s3://corpus", server.settings()).client
    planned_bytes = client.get_object(Bucket="corpus", Key=key)["Body"].read()
    if change == "overwrite":
        client.put_object(Bucket="corpus", Key=key, Body=b'{"text": "a new version"}\n')
    else:
        client.delete_object(Bucket="corpus", Key=key)

    loader = start_loader(spec, "topics", 0, tmp_path, "--unit-seconds", "0.005")
    assert loader.wait(240) == 5, (tmp_path / "loader-topics-0.log").read_text()[-3000:]
    last = (tmp_path / "loader-topics-0.log").read_text().strip().splitlines()[-1]
    assert last.startswith("mixflow load: error: source topics: unit "), last
    assert f"s3://corpus/{key}: {reason}" in last and "restore the object" in last, last
    assert f"mixflow topics delete --job {unique_name}`" in last, last
    assert dead_letters(kafka_bootstrap, topics) == []
    ids = Counter(committed_sample_ids(kafka_bootstrap, topics, "topics"))
    assert ids and set(ids.values()) == {1}, "no unit before the changed one committed, or one twice"
    assert not any(sample_id.startswith(f"topics/{changed.path}/") for sample_id in ids)
    whole_units = {u for u, unit_ids in per_unit.items() if unit_ids and set(unit_ids) <= ids.keys()}
    assert sum(len(per_unit[u]) for u in whole_units) == len(ids), "a unit committed in part"

    client.put_object(Bucket="corpus", Key=key, Body=planned_bytes)  # the same bytes: the planned ETag
    wait_all([start_loader(spec, "topics", 0, tmp_path)], 240, tmp_path)
    ids = Counter(committed_sample_ids(kafka_bootstrap, topics, "topics"))
    assert ids == Counter(sample_id for unit_ids in per_unit.values() for sample_id in unit_ids)
    assert set(ids.values()) == {1}
