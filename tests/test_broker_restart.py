"""A loader rides out its broker going away and coming back, and still delivers every sample once."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.kafka.work_plan import read_work_plan, request_epoch
from pipeline.spec import load_spec
from pipeline.tools.stack.local_broker import LocalBroker
from tests.loader_support import (
    build_example_data,
    committed_sample_ids,
    expected_sample_ids,
    source_topic_growth,
    start_loader,
    wait_all,
    write_spec,
)
from topics.formats.names import JobTopics


@pytest.mark.kafka  # starts a broker of its own (not the session's), so not part of the pure suite
def test_a_loader_survives_a_broker_restart(
    private_broker: tuple[LocalBroker, str], tmp_path: Path, unique_name: str
) -> None:
    broker, bootstrap = private_broker
    # Three epochs of the code of 200 modules take seconds to tokenize: the broker goes away mid-source.
    data = build_example_data(tmp_path / "data", limit=200)
    spec = write_spec(tmp_path, unique_name, bootstrap, data, epochs=3)
    # Named on the command line: $KAFKA_BOOTSTRAP_SERVERS (the session's broker) would win over the spec.
    loader = start_loader(spec, "code", 0, tmp_path, "--unit-seconds", "0.01", "--bootstrap-servers", bootstrap)
    growth = source_topic_growth(bootstrap, JobTopics(unique_name))
    growth.wait_for(20, lambda: loader.poll() is None, timeout_s=120)
    growth.close()
    assert loader.poll() is None, "the loader finished before the broker could be stopped"

    broker.down()
    stopped_at = time.monotonic()
    assert broker.up() == bootstrap
    print(f"broker was away for {time.monotonic() - stopped_at:.1f} s")

    # librdkafka can wedge a transactional call when the coordinator went away (librdkafka#5456): the
    # loader then exits with code 3 and, as a supervisor would, the test starts it again.
    if loader.wait(timeout=240) == 3:
        loader = start_loader(spec, "code", 0, tmp_path, "--unit-seconds", "0.01", "--bootstrap-servers", bootstrap)
    wait_all([loader], timeout_s=240, log_dir=tmp_path)
    got = committed_sample_ids(bootstrap, JobTopics(unique_name), "code")
    assert len(got) == len(set(got)), "a sample was delivered twice"
    assert set(got) == set(expected_sample_ids(load_spec(spec), bootstrap, "code"))


@pytest.mark.kafka  # starts a broker of its own (not the session's), which it stops for longer than a session
def test_idle_loaders_come_back_to_their_group_after_a_long_outage_and_take_new_work(
    private_broker: tuple[LocalBroker, str], tmp_path: Path, unique_name: str
) -> None:
    """Loaders whose session lapsed while the broker was away can be left without their work partitions by
    librdkafka, and the next epoch's units would lie untouched: each loader replaces a consumer left without an
    assignment (here after 3 s) once the broker answers."""
    broker, bootstrap = private_broker
    data = build_example_data(tmp_path / "data", limit=12)
    spec = write_spec(tmp_path, unique_name, bootstrap, data, on_exhausted="next_epoch")
    topics = JobTopics(unique_name)
    extra = ("--bootstrap-servers", bootstrap, "--rejoin-after-s", "3", "--session-timeout-ms", "4000")
    loaders = [start_loader(spec, "code", i, tmp_path, *extra) for i in range(2)]
    try:
        wait_for_every_unit(spec, bootstrap, loaders, tmp_path, epochs=1)

        # Longer than the loaders' 4 s session: their membership lapses while the broker is away.
        broker.down()
        time.sleep(6.0)
        assert broker.up() == bootstrap
        request_epoch({"bootstrap.servers": bootstrap}, topics, "code", 1)
        restarts = wait_for_every_unit(spec, bootstrap, loaders, tmp_path, epochs=2, restart=extra)
    finally:
        for loader in loaders:
            loader.send_signal(signal.SIGTERM)
    wait_all(loaders, timeout_s=60, log_dir=tmp_path)
    got = committed_sample_ids(bootstrap, topics, "code")
    assert len(got) == len(set(got)), "a sample was delivered twice"
    assert set(got) == set(expected_sample_ids(load_spec(spec), bootstrap, "code"))
    logs = "".join((tmp_path / f"loader-code-{i}.log").read_text() for i in range(2))
    replaced = "joining as a new member" in logs
    assert replaced or restarts, "no loader replaced its consumer or exited for it: the outage did not test it"


def wait_for_every_unit(
    spec: Path,
    bootstrap: str,
    loaders: list[subprocess.Popen],
    log_dir: Path,
    epochs: int,
    timeout_s: float = 180,
    restart: tuple[str, ...] | None = None,
) -> int:
    """Until the source's plan has ``epochs`` epochs and the source topic holds every sample of them. With
    ``restart`` (their extra arguments), a loader that exits 3 (a stuck Kafka client: its consumer did not
    close) is started again, as a supervisor would; returns how many were."""
    job = load_spec(spec)
    deadline = time.monotonic() + timeout_s
    restarts = 0
    while True:
        plan = read_work_plan({"bootstrap.servers": bootstrap}, JobTopics(job.job), "code")
        planned = plan is not None and plan.epochs_planned(1) >= epochs
        if planned and set(committed_sample_ids(bootstrap, JobTopics(job.job), "code")) == set(
            expected_sample_ids(job, bootstrap, "code")
        ):
            return restarts
        for i, process in enumerate(loaders):
            if restart is not None and process.poll() == 3:
                loaders[i] = start_loader(spec, "code", i, log_dir, *restart)
                restarts += 1
        exited = [f"loader {i} exited {p.returncode}" for i, p in enumerate(loaders) if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            why = ", ".join(exited) or f"not every unit of {epochs} epoch(s) done within {timeout_s:.0f} s"
            tails = "\n".join((log_dir / f"loader-code-{i}.log").read_text()[-2500:] for i in range(len(loaders)))
            raise AssertionError(f"{why}; the loader logs end with:\n{tails}")
        time.sleep(0.5)  # a topic watched from outside: nothing to block on
