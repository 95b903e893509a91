"""A whole job (loaders, constructor, supervisor) rides out its broker stopping and starting mid-run: no
role dies of a retriable error, and every sample still reaches the rank topics exactly once."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.tools.stack.local_broker import LocalBroker
from tests.kafka_support import TopicGrowth
from tests.loader_support import REPO, SOURCES, build_example_data, committed_sample_ids, write_spec
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end


# What a restart does to the roles' clients: one can forget a partition (_UNKNOWN_PARTITION on an end-offset
# lookup, which is retried), and a transactional producer can wait forever in send_offsets once the broker is
# back (librdkafka#5511), until the watchdog ends the role with 3 (after 25 s: one attempt is watched, not the
# whole retry deadline).
@pytest.mark.kafka  # starts a broker of its own (not the session's)
@pytest.mark.timeout(600)  # a whole job and a broker restart: its own waits bound it (180 s, then 300 s)
def test_a_job_survives_a_broker_restart(
    private_broker: tuple[LocalBroker, str], tmp_path: Path, unique_name: str
) -> None:
    broker, bootstrap = private_broker
    data = build_example_data(tmp_path / "data", limit=60)
    spec = write_spec(tmp_path, unique_name, bootstrap, data, on_exhausted="renormalize",
                      step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512})  # fmt: skip
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--bootstrap-servers", bootstrap,
               "--state-dir", str(tmp_path / "state")]  # fmt: skip
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    growth = TopicGrowth(bootstrap, [JobTopics(unique_name).state])
    growth.wait_for(20, lambda: run.poll() is None, timeout_s=180)
    growth.close()
    assert run.poll() is None, "the job finished before the broker could be stopped"
    broker.down()
    stopped_at = time.monotonic()
    assert broker.up() == bootstrap
    print(f"broker was away for {time.monotonic() - stopped_at:.1f} s")
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stdout[-3000:] + _without_librdkafka_lines(stderr)[-3000:] + _role_logs(tmp_path)
    # A stuck Kafka client (librdkafka#5456) exits with 3 by design and is restarted; nothing may die of an error.
    died = [m for m in re.findall(r"(\S+) exited with (-?\d+);", stderr) if m[1] != "3"]
    assert died == [], f"roles died during the broker restart: {died}\n{_role_logs(tmp_path)}"
    assert "each sample exactly once: yes" in stdout, stdout

    topics = JobTopics(unique_name)
    delivered: Counter[str] = Counter()
    for rank in range(2):
        for record in read_to_end({"bootstrap.servers": bootstrap}, topics.rank(rank)):
            if end_of_data_steps(record.headers()) is None:
                delivered.update(decode_batch_message(record).sample_ids)
    every = {i for s in SOURCES for i in committed_sample_ids(bootstrap, topics, s)}
    assert max(delivered.values()) == 1 and set(delivered) == every


def _without_librdkafka_lines(text: str) -> str:
    """Without librdkafka's own log lines (``%<level>|...``), which fill the output while the broker is away."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("%"))


def _role_logs(tmp_path: Path, lines: int = 25) -> str:
    """The end of every role's log, for a failure message that says what happened."""
    tails = []
    for path in sorted((tmp_path / "state").glob("jobs/*/*.log")):
        tail = _without_librdkafka_lines(path.read_text(errors="replace")).splitlines()[-lines:]
        tails.append(f"--- {path.name}:\n" + "\n".join(tail))
    return "\n".join(tails)
