"""``on_exhausted: next_epoch``: when a source runs out, the constructor asks its loaders for another pass
(a new shuffle from the job seed, ids ending ``@e<n>``), and the job streams on with nothing repeated."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipeline.kafka.work_plan import WorkPlan
from tests.loader_support import REPO, build_example_data, start_loader, write_spec
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end

STEPS = 40


@pytest.mark.kafka
@pytest.mark.parametrize("composed", [False, True], ids=["in-order", "composed"])
def test_a_source_that_runs_out_starts_another_epoch(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, composed: bool
) -> None:
    data = build_example_data(tmp_path / "data", limit=8)
    path = write_spec(tmp_path, unique_name, kafka_bootstrap, data, on_exhausted="next_epoch",
                      step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512})  # fmt: skip
    body = yaml.safe_load(path.read_text())
    body["sources"] = [s for s in body["sources"] if s["name"] == "code"]
    body["mixture"] = {"weights": {"code": 1}}
    if not composed:
        body["composition"] = None
    path.write_text(yaml.safe_dump(body, sort_keys=False))

    # The loader stays under next_epoch (until-drained does not end it) to plan the epochs asked for.
    loader = start_loader(path, "code", 0, tmp_path)
    construct = [sys.executable, "-m", "pipeline.cli", "construct", "--spec", str(path), "--max-steps", str(STEPS)]
    done = subprocess.run(construct, cwd=REPO, capture_output=True, text=True, timeout=300)
    loader.send_signal(signal.SIGTERM)
    assert loader.wait(timeout=60) == 0, (tmp_path / "loader-code-0.log").read_text()[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]

    topics = JobTopics(unique_name)
    per_rank = []
    for rank in range(2):
        records = read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.rank(rank))
        assert all(end_of_data_steps(r.headers()) is None for r in records), "a streaming job does not end"
        per_rank.append([decode_batch_message(r) for r in records])
    assert [len(b) for b in per_rank] == [STEPS, STEPS]
    delivered = Counter(i for batches in per_rank for b in batches for i in b.sample_ids)
    assert [i for i, n in delivered.items() if n > 1] == [], "a sample was delivered twice"

    first = {decode_sample_message(r).sample_id for r in read_to_end({"bootstrap.servers": kafka_bootstrap},
                                                                      topics.src("code"))}  # fmt: skip
    first = {i for i in first if "@e" not in i}
    by_epoch: dict[int, set[str]] = {}
    for sample_id in delivered:
        base, _, epoch = sample_id.partition("@e")
        by_epoch.setdefault(int(epoch or 0), set()).add(base)
    if composed:
        # Composition takes samples from a window that spans the end of an epoch: a pass may still lack
        # samples (each delivered within the waiting bound) when the next one begins.
        assert all(ids <= first for ids in by_epoch.values()) and len(by_epoch) >= 2, sorted(by_epoch)
        return
    assert by_epoch[0] == first, "the first pass is delivered whole"
    assert by_epoch[1] == first, "the second pass holds every sample once more"
    assert 2 in by_epoch and by_epoch[2] <= first, "a third pass has begun"
    assert sorted(by_epoch) == [0, 1, 2]


def test_a_plan_extended_by_epochs_round_trips() -> None:
    extended = WorkPlan("code", 10, {0: 5, 1: 5}, epochs=3)
    assert WorkPlan.from_json(extended.to_json()) == extended
    assert extended.epochs_planned(1) == 3 and WorkPlan("code", 4, {0: 4}).epochs_planned(2) == 2
    assert b"epochs" not in WorkPlan("code", 4, {0: 4}).to_json()  # a plan of the spec's epochs: no field


def test_work_units_a_broker_never_took_are_a_retriable_error_not_a_failure(unique_name: str) -> None:
    """Work units whose delivery timed out (the brokers were away) raise ``KafkaUnavailableError``, which the
    loader's epoch planning answers by planning again later, instead of ending the loader."""
    from confluent_kafka import Producer

    from connectors.work_units import WorkUnit
    from pipeline.kafka.work_plan import produce_units
    from pipeline.tools.stack.local_broker import free_port_pair
    from topics.kafka.retry import KafkaUnavailableError

    nobody = f"127.0.0.1:{free_port_pair()}"
    producer = Producer({"bootstrap.servers": nobody, "message.timeout.ms": 500, "log_level": 0})
    units = [WorkUnit("web", "a.jsonl", "file", 0, 1)]
    base = WorkPlan(source="web", units=0, ends={})
    with pytest.raises(KafkaUnavailableError, match="publishing the work units of web"):
        produce_units(producer, JobTopics(unique_name), "web", units, 1, base)
