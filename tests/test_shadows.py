"""Shadow constructors: a second `mixflow construct` of a job waits as a shadow and takes over from the
last committed step when the active one is killed, or fences it when it was only paused. Either way the
job's batches are byte for byte those of an undisturbed run, with every sample exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.spec import load_spec
from tests.kafka_support import TopicGrowth
from tests.loader_support import (
    REPO,
    SOURCES,
    build_example_data,
    committed_sample_ids,
    start_constructor,
    start_loader,
    wait_all,
    write_spec,
)
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end

RANKS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_data(tmp_path_factory.mktemp("shadows") / "data", limit=12)


def _construct(spec: Path, instance: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pipeline.cli", "construct", "--spec", str(spec), "--instance", instance]
    command += ["--transaction-timeout-ms", "10000"]
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=REPO)


def _summary(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines, f"no summary in {log}:\n{log.read_text()[-3000:]}"
    return json.loads(lines[-1])


def _finish(processes: list[subprocess.Popen], logs: list[Path], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    for process, log in zip(processes, logs, strict=True):
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise AssertionError(f"{process.args} did not finish; its log ends:\n{log.read_text()[-3000:]}") from None
        assert process.returncode == 0, f"{process.args} exited {process.returncode}:\n{log.read_text()[-3000:]}"


def _wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, f"{process.args} exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{log} has no {text!r} after {timeout_s} s"
        time.sleep(0.05)  # polling another process's log


def _rank_messages(bootstrap: str, job: str) -> list[list[tuple[bytes | None, bytes | None, list]]]:
    """Per rank, every committed message as (key, value, headers)."""
    config = {"bootstrap.servers": bootstrap}
    return [
        [(m.key(), m.value(), m.headers() or []) for m in read_to_end(config, JobTopics(job).rank(r))]
        for r in range(RANKS)
    ]


def _run_with_a_shadow(spec: Path, folder: Path, bootstrap: str, disturb: str) -> tuple[dict, dict, list[float]]:
    """Loaders, an active and a shadow constructor; once two steps are written, ``disturb`` the active one
    ("kill" or "pause" it, resuming a paused one once the shadow has written two steps). Returns both
    constructors' summaries and the seconds from the disturbance to the next step written."""
    job = load_spec(spec).job
    logs = [folder / "construct-a.log", folder / "construct-b.log"]
    first = _construct(spec, "a", logs[0])
    state = TopicGrowth(bootstrap, [JobTopics(job).state])
    try:
        _wait_for_line(logs[0], "holds the constructor lease", first)  # a is active before b starts
        second = _construct(spec, "b", logs[1])
        loaders = [start_loader(spec, source, 0, folder) for source in SOURCES]
        state.wait_for(4, lambda: first.poll() is None, timeout_s=120)  # two steps and their markers
        assert first.poll() is None, "the job ended before the active constructor could be disturbed"
        before = state.records()
        first.send_signal(signal.SIGKILL if disturb == "kill" else signal.SIGSTOP)
        disturbed = time.monotonic()
        state.wait_for(before + 1, lambda: second.poll() is None, timeout_s=60)
        gaps = [time.monotonic() - disturbed]
        if disturb == "pause":
            state.wait_for(before + 4, lambda: second.poll() is None, timeout_s=60)
            first.send_signal(signal.SIGCONT)
        wait_all(loaders, 240, folder)
        if disturb == "kill":
            first.wait(10)
            _finish([second], logs[1:])
            return {}, _summary(logs[1]), gaps
        _finish([first, second], logs)
        return _summary(logs[0]), _summary(logs[1]), gaps
    finally:
        state.close()
        for process in (first,):
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)


def _check_against_an_undisturbed_run(spec: Path, bootstrap: str, folder: Path) -> None:
    job = load_spec(spec).job
    reference = f"{job}-ref"
    log = folder / "reference.log"
    done = start_constructor(spec, reference, log=log)
    assert done.wait(timeout=240) == 0, log.read_text()[-3000:]
    disturbed, undisturbed = _rank_messages(bootstrap, job), _rank_messages(bootstrap, reference)
    for rank in range(RANKS):
        assert len(disturbed[rank]) == len(undisturbed[rank]), f"rank {rank}: step counts differ"
        for step, (got, want) in enumerate(zip(disturbed[rank], undisturbed[rank], strict=True)):
            assert got == want, f"rank {rank}, message {step}: differs from the undisturbed run"
    from topics.formats.batch_codec import decode_batch_message, end_of_data_steps

    delivered: Counter[str] = Counter()
    for rank in range(RANKS):
        for record in read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(rank)):
            if end_of_data_steps(record.headers()) is None:
                delivered.update(decode_batch_message(record).sample_ids)
    expected: Counter[str] = Counter()
    for source in SOURCES:
        expected.update(committed_sample_ids(bootstrap, JobTopics(job), source))
    assert delivered == expected


@pytest.mark.parametrize("disturb", ["kill", "pause"])
def test_a_shadow_takes_over_and_the_job_is_what_an_undisturbed_run_writes(
    kafka_bootstrap: str, data: Path, tmp_path: Path, unique_name: str, disturb: str
) -> None:
    spec = write_spec(
        tmp_path,
        unique_name,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        step={"ranks": RANKS, "micro_batches": 1, "tokens_per_micro_batch": 512},
    )
    paused, shadow, gaps = _run_with_a_shadow(spec, tmp_path, kafka_bootstrap, disturb)
    assert shadow["takeovers"] == 1 and shadow["finished"], shadow
    assert gaps[0] < 30, f"the shadow took {gaps[0]:.1f} s to write a step"
    if disturb == "pause":
        # The paused instance lost the lease while stopped and was fenced; it followed the job to its end
        # (and may hold the lease again once the other instance exits). What it wrote is checked below.
        assert paused["finished"], paused
    _check_against_an_undisturbed_run(spec, kafka_bootstrap, tmp_path)
