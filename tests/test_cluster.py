"""A local 3-node KRaft cluster (`mixflow stack up --brokers 3`): its layout and settings, and a whole job that
loses a broker to SIGKILL mid-run and still delivers every sample exactly once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st

from pipeline.tools.stack.local_broker import free_port_block, override_properties
from pipeline.tools.stack.local_cluster import ClusterLayout, LocalCluster
from tests.kafka_support import TopicGrowth
from tests.loader_support import REPO, SOURCES, build_example_data, committed_sample_ids, write_spec
from tests.test_compose import read_properties
from tests.test_job_broker_restart import _role_logs, _without_librdkafka_lines
from topics.errors import MixflowError
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.kafka.admin import default_replication_factor, describe_job_topics, min_insync_replicas
from topics.kafka.log_reader import read_to_end

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
KEYS = st.builds(str.__add__, st.sampled_from(_LETTERS), st.text(alphabet=_LETTERS + ".", max_size=12))
VALUES = st.text(alphabet=_LETTERS + _LETTERS.upper() + "0123456789:/@,.", max_size=12)


def _parse(text: str) -> dict[str, str]:
    pairs = [line.partition("=") for line in text.splitlines() if line and not line.startswith("#")]
    return {key: value for key, _, value in pairs}


@given(base=st.dictionaries(KEYS, VALUES), overrides=st.dictionaries(KEYS, VALUES), comment=VALUES)
def test_overrides_replace_properties_in_place_or_add_them(
    base: dict[str, str], overrides: dict[str, str], comment: str
) -> None:
    text = f"# {comment}\n" + "".join(f"{key}={value}\n" for key, value in base.items())
    out = override_properties(text, overrides)
    assert _parse(out) == {**base, **overrides}
    assert out.splitlines()[0] == f"# {comment}", "comments are kept"
    keys = [line.partition("=")[0] for line in out.splitlines()[1:]]
    assert keys == [*base, *(key for key in overrides if key not in base)], "base keys keep their place"


@given(brokers=st.integers(2, 9), port=st.integers(1024, 65535 - 18))
def test_a_cluster_layout_gives_each_node_its_ports_and_the_shared_settings(brokers: int, port: int) -> None:
    layout = ClusterLayout("id", "127.0.0.1", port, brokers)
    ports = [p for i in layout.node_ids for p in (layout.client_port(i), layout.controller_port(i))]
    assert sorted(ports) == list(range(port, port + 2 * brokers)), "consecutive ports, none shared"
    assert layout.bootstrap.split(",") == [f"127.0.0.1:{layout.client_port(i)}" for i in layout.node_ids]
    factor = min(3, brokers)
    for i in layout.node_ids:
        node = layout.overrides(i)
        assert node["node.id"] == str(i)
        assert node["controller.quorum.voters"].split(",") == [
            f"{j}@127.0.0.1:{layout.controller_port(j)}" for j in layout.node_ids
        ]
        for key in ("default.replication.factor", "offsets.topic.replication.factor"):
            assert node[key] == str(factor), key
        assert node["transaction.state.log.replication.factor"] == str(factor)
        for key in ("min.insync.replicas", "transaction.state.log.min.isr"):
            assert node[key] == ("2" if brokers >= 3 else "1"), key


@pytest.mark.parametrize("brokers", range(1, 8))
def test_replication_follows_the_number_of_brokers(brokers: int) -> None:
    factor = default_replication_factor(brokers)
    assert factor == min(3, brokers)
    assert min_insync_replicas(factor) == (2 if brokers >= 3 else 1)
    assert min_insync_replicas(factor) < factor or factor == 1, "one broker down must stop no writer"


def test_a_cluster_refuses_settings_other_than_it_was_made_with(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps(ClusterLayout("abc", "127.0.0.1", 30000, 3).__dict__))
    assert LocalCluster(tmp_path).bootstrap == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    with pytest.raises(MixflowError, match=r"brokers 2 \(recorded 3\)"):
        LocalCluster(tmp_path, brokers=2)
    with pytest.raises(MixflowError, match=r"port 30010 \(recorded 30000\)"):
        LocalCluster(tmp_path, port=30010)
    with pytest.raises(MixflowError, match=r"node 4 is not in the cluster .* \(nodes 1..3\)"):
        LocalCluster(tmp_path).node(4)
    with pytest.raises(MixflowError, match="at least 2 brokers"):
        LocalCluster(tmp_path / "other", brokers=1)
    (tmp_path / "cluster.json").write_text("{}")
    with pytest.raises(MixflowError, match=r"cluster\.json is not a cluster record"):
        LocalCluster(tmp_path)


# -- against a cluster of the test's own ---------------------------------------------------------------


@pytest.fixture
def example_data(tmp_path: Path) -> Iterator[Future[Path]]:
    """The example data, built on a thread while the cluster's JVMs start."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(build_example_data, tmp_path / "data", 30)


@pytest.fixture
def cluster(tmp_path: Path, example_data: Future[Path]) -> Iterator[LocalCluster]:
    """A 3-node cluster on free ports in the test's folder, beside the session's broker; killed at the end
    (its folder is thrown away, so a clean shutdown would only cost time)."""
    cluster = LocalCluster(tmp_path / "cluster", brokers=3, port=free_port_block(6))
    started = time.monotonic()
    try:
        cluster.up()
        print(f"3-node cluster up in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        for node in (1, 2, 3):
            cluster.stop_node(node, kill=True)


@pytest.mark.kafka  # starts brokers of its own (not the session's)
def test_a_job_goes_on_when_a_broker_is_killed_and_loses_nothing(
    cluster: LocalCluster, example_data: Future[Path], tmp_path: Path, unique_name: str
) -> None:
    bootstrap = cluster.bootstrap
    pids = {i: cluster.node(i).running_pid() for i in (1, 2, 3)}
    assert cluster.up() == bootstrap and {i: cluster.node(i).running_pid() for i in (1, 2, 3)} == pids, (
        "a second `up` started nodes although all ran"
    )
    for i in (1, 2, 3):
        props = read_properties(cluster.node(i).config_dir / "server.properties")
        assert props["node.id"] == str(i) and props["min.insync.replicas"] == "2"
        assert props["group.min.session.timeout.ms"] == "1000", "the single broker's settings are kept"

    spec = write_spec(tmp_path, unique_name, bootstrap, example_data.result(), on_exhausted="renormalize",
                      step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 2048})  # fmt: skip
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--bootstrap-servers", bootstrap,
               "--state-dir", str(tmp_path / "state")]  # fmt: skip
    report = tmp_path / "run.out"
    with report.open("w") as out:
        run = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.PIPE, text=True)
    supervisor = _Lines(run.stderr)  # a pipe: asked for above
    topics = JobTopics(unique_name)

    def running() -> bool:
        return run.poll() is None

    # Mid-run: the loaders are done (each unit's transaction rides out a broker restart, tests/test_loader.py)
    # and the constructor, with most of its steps to go, loses a broker.
    loaders = [f"load-{source}-0 finished" for source in SOURCES]
    supervisor.wait_for(lambda text: all(line in text for line in loaders), running, timeout_s=120)
    progress = TopicGrowth(bootstrap, [topics.state])
    progress.wait_for(4, running, timeout_s=120)  # 2 steps written: the constructor is under way
    written = progress.records()
    assert running(), "the job finished before a broker could be killed"
    victim = _victim(bootstrap, topics)
    assert cluster.stop_node(victim, kill=True)
    killed_at = time.monotonic()
    # The job goes on without the node: steps commit while it is down (2 offsets a step: the state record and
    # the transaction's commit marker).
    progress.wait_for(written + 10, running, timeout_s=120)
    progress.close()
    assert cluster.node(victim).running_pid() is None
    print(f"node {victim} killed at state offset {written}; 5 steps more {time.monotonic() - killed_at:.1f} s later")
    # Back while the job runs: the node's JVM starts beside the job, then catches up.
    cluster.start_node(victim, wait=False)

    try:
        run.wait(timeout=240)
    finally:
        run.kill()  # nothing left to kill when it finished; ends it when the wait timed out
    stdout, stderr = report.read_text(), supervisor.close()
    logs = _role_logs(tmp_path)
    assert run.returncode == 0, stdout[-3000:] + _without_librdkafka_lines(stderr)[-3000:] + logs
    # A stuck Kafka client (librdkafka#5456) exits with 3 by design and is restarted; nothing may die of an error.
    died = [m for m in re.findall(r"(\S+) exited with (-?\d+);", stderr) if m[1] != "3"]
    assert died == [], f"roles died when node {victim} was killed: {died}\n{logs}"
    assert "each sample exactly once: yes" in stdout, stdout

    delivered: Counter[str] = Counter()
    for rank in range(2):
        for record in read_to_end({"bootstrap.servers": bootstrap}, topics.rank(rank)):
            if end_of_data_steps(record.headers()) is None:
                delivered.update(decode_batch_message(record).sample_ids)
    every = {i for s in SOURCES for i in committed_sample_ids(bootstrap, topics, s)}
    assert every and max(delivered.values()) == 1 and set(delivered) == every

    # Every job topic is on all three nodes and takes writes with one of them down.
    replicas = _replicas(bootstrap, unique_name)
    assert {name: len(r) for name, r in replicas.items()} == dict.fromkeys(replicas, 3)
    configs = describe_job_topics(bootstrap, unique_name)
    assert set(configs) == {name.partition("/")[0] for name in replicas}
    assert {name: spec.config.get("min.insync.replicas") for name, spec in configs.items()} == dict.fromkeys(
        configs, "2"
    )

    # The killed node is back and has caught up: it is in sync again on every partition of the job.
    cluster.wait_until_complete(timeout_s=90)
    _wait_in_sync(bootstrap, unique_name, victim, timeout_s=60)


class _Lines:
    """A process's output, read on a thread, so that the test can wait for a line with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, found: Callable[[str], bool], still_running: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not found(self.text()):
            if not still_running() or time.monotonic() > deadline:
                why = "the process ended" if not still_running() else f"{timeout_s} s passed"
                msg = f"{why} before the line looked for; the output ends with:\n{self.text()[-3000:]}"
                raise AssertionError(msg)
            time.sleep(0.05)  # poll interval of the reader's lines

    def text(self) -> str:
        return "".join(list(self.lines))

    def close(self) -> str:
        self.thread.join(timeout=30)
        return self.text()


def _victim(bootstrap: str, topics: JobTopics) -> int:
    """The node that leads the state topic (the constructor writes it in every step's transaction), or a
    rank topic, unless it coordinates the constructor's consumer group: librdkafka's send_offsets hangs when
    that coordinator leaves the metadata (confluentinc/librdkafka#5511) until the role's 25 s watchdog ends it
    with exit 3 (the job still loses nothing; tested there as a restart of the single broker)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    group = f"{topics.job}.constructor"  # its transactional.id, also the group of its source offsets
    coordinator = admin.describe_consumer_groups([group])[group].result(timeout=10).coordinator.id
    metadata = admin.list_topics(timeout=10)
    leaders = [metadata.topics[name].partitions[0].leader for name in (topics.state, topics.rank(0), topics.rank(1))]
    return next(node for node in [*leaders, 1, 2, 3] if node != coordinator)


def _replicas(bootstrap: str, job: str) -> dict[str, list[int]]:
    """Each partition of the job's topics (``topic/partition``) and its replicas."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {
        f"{name}/{p}": list(partition.replicas)
        for name, topic in metadata.topics.items()
        if name.startswith(JobTopics(job).prefix)
        for p, partition in topic.partitions.items()
    }


def _wait_in_sync(bootstrap: str, job: str, node: int, timeout_s: float) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10)
        behind = sorted(
            f"{name}/{p}"
            for name, topic in metadata.topics.items()
            if name.startswith(JobTopics(job).prefix)
            for p, partition in topic.partitions.items()
            if node not in partition.isrs
        )
        if not behind:
            return
        if time.monotonic() > deadline:
            msg = f"node {node} did not rejoin the in-sync replicas of {behind} within {timeout_s} s"
            raise AssertionError(msg)
        time.sleep(0.2)  # poll interval of the metadata probe
