"""The chaos suite at a size for CI: the fault schedule (pure), the audit that ends a run (it finds what
it claims to find), the chaos sink's exactly-once record across SIGKILLs, and a whole job (three text sources
and one of image-text pairs) on a private broker under one fault of every kind, audited at the end, media
bytes included. `benchmarks/chaos_bench.py` runs 100+ faults (`--multimodal`: the multimodal example job)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.spec import StepSpec
from pipeline.tools.chaos import ChaosOptions, FaultKind, Targets, plan_faults, run_chaos
from pipeline.tools.chaos.audit import check_samples, check_sink_record, read_rank_topic
from pipeline.tools.chaos.roles import RoleKind, Supervisor
from pipeline.tools.chaos.schedule import ACCESS_KINDS, OBJECT_STORE_KINDS
from pipeline.tools.chaos.sink_state import checkpoint_steps
from pipeline.tools.delivery import RECEIVED_FILE, rank_micro_batches, sample_sha256, tokens_sha256
from tests.caption_shards import caption_source, write_caption_shards
from tests.loader_support import REPO, build_example_data, write_spec
from tests.sink_support import random_batch, write_sink_spec, write_steps
from topics.formats.batch import Batch
from topics.formats.media import MediaItem
from topics.formats.sample import Sample

TARGETS = Targets(loaders=("load-a-0", "load-b-0", "load-b-1"), sinks=("sink-0", "sink-1"), shadows=1, broker=True)

# -- the schedule (pure) ------------------------------------------------------------------------------


def test_a_schedule_is_reproducible_from_its_seed() -> None:
    assert plan_faults(7, 40, TARGETS) == plan_faults(7, 40, TARGETS)
    assert plan_faults(7, 40, TARGETS) != plan_faults(8, 40, TARGETS)


def test_a_schedule_strikes_every_kind_and_only_what_exists() -> None:
    faults = plan_faults(3, 12, TARGETS, max_pause_s=1.5, max_down_s=2.0)
    assert [f.number for f in faults] == list(range(1, 13))
    assert {f.kind for f in faults} == set(FaultKind) - OBJECT_STORE_KINDS - ACCESS_KINDS
    for fault in faults:
        assert 0 <= fault.pause_s <= 1.5
        if fault.kind is FaultKind.KILL_LOADER:
            assert fault.target in TARGETS.loaders
        elif fault.kind is FaultKind.KILL_SINK:
            assert fault.target in TARGETS.sinks
        else:
            assert fault.target is None
        assert (0 <= fault.down_s <= 2.0) if fault.kind is FaultKind.RESTART_BROKER else fault.down_s == 0

    fixed = Targets(loaders=("load-a-0",), sinks=("sink-0",), shadows=0, broker=False)
    kinds = {f.kind for f in plan_faults(3, 50, fixed)}
    assert kinds == {FaultKind.KILL_LOADER, FaultKind.KILL_ACTIVE_CONSTRUCTOR, FaultKind.KILL_SINK}
    assert len({f.kind for f in plan_faults(3, 2, TARGETS)}) == 2, "fewer faults than kinds: each a different kind"


# -- the supervisor ----------------------------------------------------------------------------------


def test_the_supervisor_restarts_a_killed_role_and_reports_one_that_died_on_its_own(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, dict(os.environ))
    sleeper = supervisor.start("sleeper", RoleKind.LOADER, [sys.executable, "-c", "import time; time.sleep(60)"])
    done = supervisor.start("done", RoleKind.SINK, [sys.executable, "-c", "print('bye')"], finite=True)
    dying = [sys.executable, "-c", "import sys; print('Traceback (most recent call last):'); sys.exit(5)"]
    supervisor.start("dying", RoleKind.CONSTRUCTOR, dying)
    try:
        first = sleeper.pid
        supervisor.kill(sleeper)
        deadline = time.monotonic() + 30
        while not (done.done and supervisor.failures and sleeper.running):
            assert time.monotonic() < deadline, "the supervisor did not sort out the exits"
            supervisor.poll()
            time.sleep(0.05)
        assert sleeper.pid != first and (sleeper.starts, sleeper.kills) == (2, 1)
        assert [(f.role, f.code) for f in supervisor.failures] == [("dying", 5)]
        assert supervisor.logged_errors() == {"dying": 1}
    finally:
        supervisor.kill_all()


def test_a_role_whose_kafka_client_got_stuck_is_started_again_and_reported_apart(tmp_path: Path) -> None:
    flag = tmp_path / "stuck-once"
    stuck_once = (
        f"import pathlib, sys; f = pathlib.Path({str(flag)!r})\n"
        "if not f.exists():\n    f.touch(); print('mixflow construct: error: stuck'); sys.exit(3)"
    )
    supervisor = Supervisor(tmp_path, dict(os.environ))
    role = supervisor.start("construct-0", RoleKind.CONSTRUCTOR, [sys.executable, "-c", stuck_once], finite=True)
    try:
        deadline = time.monotonic() + 30
        while not role.done:
            assert time.monotonic() < deadline, "the supervisor did not start the stuck role again"
            supervisor.poll()
            time.sleep(0.05)
        assert role.starts == 2 and supervisor.failures == []
        assert supervisor.stuck_restarts() == {"construct-0": 1} and supervisor.logged_errors() == {}
    finally:
        supervisor.kill_all()


# -- the audit finds what it claims to find ---------------------------------------------------------


def _steps(rng: np.random.Generator, count: int, ranks: int = 2) -> list[list[Batch]]:
    return [[random_batch(rng, step, rank, ranks, 2, 64) for rank in range(ranks)] for step in range(count)]


@pytest.mark.kafka
def test_the_audit_finds_steps_out_of_order_and_a_wrong_end(kafka_bootstrap: str, unique_name: str) -> None:
    steps = _steps(np.random.default_rng(1), 5)
    shape = StepSpec(ranks=2, micro_batches=2, tokens_per_micro_batch=64)
    config = {"bootstrap.servers": kafka_bootstrap}

    write_steps(kafka_bootstrap, f"{unique_name}-ok", steps)
    problems: list[str] = []
    assert len(read_rank_topic(config, f"{unique_name}-ok", 1, shape, problems)) == 5
    assert problems == []

    write_steps(kafka_bootstrap, f"{unique_name}-bad", [steps[0], steps[2], steps[1]], end_steps=4)
    read_rank_topic(config, f"{unique_name}-bad", 0, shape, problems)
    assert len(problems) == 3, problems
    assert "step 2 where step 1 was due" in problems[0] and "step 1 where step 2 was due" in problems[1]
    assert "3 steps, but the end-of-data record says 4" in problems[2]


def test_the_audit_finds_repeated_lost_unknown_and_changed_samples() -> None:
    steps = _steps(np.random.default_rng(2), 3)
    per_rank = [[step[r] for step in steps] for r in range(2)]
    expected = {
        i: tokens_sha256(b.tokens[b.offsets[k] : b.offsets[k + 1]])
        for b in (b for batches in per_rank for b in batches)
        for k, i in enumerate(b.sample_ids)
    }
    problems: list[str] = []
    check_samples(per_rank, expected, problems)
    assert problems == []

    first, second = per_rank[0][0].sample_ids[:2]
    tampered = {**expected, "code/never.py/0": "0" * 64, first: "f" * 64}
    del tampered[second]
    check_samples([*per_rank, [per_rank[1][2]]], tampered, problems)
    assert any("delivered more than once" in p and per_rank[1][2].sample_ids[0] in p for p in problems), problems
    assert any("never delivered" in p and "code/never.py/0" in p for p in problems), problems
    assert any("no work unit gives" in p and second in p for p in problems), problems
    assert any("other tokens" in p and first in p for p in problems), problems


def test_a_sink_record_must_hold_each_micro_batch_once(tmp_path: Path) -> None:
    batches = [step[0] for step in _steps(np.random.default_rng(3), 4)]
    lines = [
        {"step": s, "micro_batch": m, "sample_ids": ids, "tokens_sha256": digest}
        for s, m, ids, digest in rank_micro_batches(batches)
    ]
    path = tmp_path / RECEIVED_FILE.format(rank=0)
    problems: list[str] = []
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert check_sink_record(path, batches, problems) == 8 and problems == []
    # A resume that records step 1 again is forgiven by a trainer's check, not by this one.
    path.write_text("".join(json.dumps(line) + "\n" for line in [*lines[:4], *lines[2:]]))
    check_sink_record(path, batches, problems)
    assert len(problems) == 1 and "(1, 0)" in problems[0], problems


# -- the chaos sink ---------------------------------------------------------------------------------


@pytest.mark.kafka
def test_a_killed_sink_resumes_from_its_checkpoint_and_records_each_micro_batch_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    # The kills land after 20, 24 and 11 more steps (random.Random(4)): 160 steps leave the last run most of them.
    steps = _steps(np.random.default_rng(4), 160)
    write_steps(kafka_bootstrap, unique_name, steps)
    spec = write_sink_spec(tmp_path, unique_name, kafka_bootstrap, ranks=2, micro_batches=2, capacity=64)
    out = tmp_path / "sinks"
    command = [
        sys.executable,
        "-m",
        "pipeline.tools.chaos.sink",
        "--spec",
        str(spec),
        "--rank",
        "1",
        "--out",
        str(out),
        "--bootstrap-servers",
        kafka_bootstrap,
    ]
    rng = random.Random(4)
    kills = 0
    for _ in range(3):
        sink = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started = checkpoint_steps(out, 1)
        deadline = time.monotonic() + 60
        while checkpoint_steps(out, 1) < started + rng.randint(5, 60) and sink.poll() is None:
            assert time.monotonic() < deadline, "the sink made no progress"
            time.sleep(0.005)
        if sink.poll() is None:
            os.kill(sink.pid, signal.SIGKILL)
            kills += 1
        sink.communicate()
    sink = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert sink.returncode == 0, sink.stderr[-3000:]
    assert kills > 0 and json.loads(sink.stdout.splitlines()[-1]) == {"rank": 1, "steps": 160}
    problems: list[str] = []
    check_sink_record(out / RECEIVED_FILE.format(rank=1), [step[1] for step in steps], problems)
    assert problems == []


# -- a whole job under faults -----------------------------------------------------------------------


@pytest.mark.kafka  # starts a broker of its own (not the session's), which it restarts
def test_a_job_survives_a_fault_of_every_kind_with_nothing_lost_or_repeated(tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=12)
    step = {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512, "patches_per_micro_batch": 32}
    spec = write_spec(tmp_path, "chaos", "127.0.0.1:9", data, step=step)
    body = yaml.safe_load(spec.read_text())
    body["sources"][1]["loaders"] = 2  # two loaders share the docstrings
    # A multimodal source: image-text pairs, their pixels on the topics as JPEG frames, which the audit compares
    # byte for byte; the encoder's cost counts, and a micro-batch holds at most 32 patches (an image has up to 24).
    write_caption_shards(data / "captions", pairs=64, per_shard=16, seed=12)
    body["sources"].append(caption_source("captions", data / "captions"))
    body["mixture"]["weights"]["captions"] = 0.5
    body["cost"]["vision"] = {"alpha": 1.0, "beta": 50.0}
    spec.write_text(yaml.safe_dump(body, sort_keys=False))

    # The constructor stays within 2 steps of the sinks (their progress reports), so sink kills and restarts
    # pace it under every fault. Short pauses between faults and a short broker outage: each fault still waits
    # until the one before is survived, and the schedule's kinds and targets do not depend on these bounds.
    options = ChaosOptions(
        spec=spec,
        faults=7,
        seed=12,
        out=tmp_path / "chaos",
        shadows=1,
        max_lead_steps=2,
        max_pause_s=0.5,
        max_down_s=1.0,
    )
    report = run_chaos(options)
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.lines())
    survived = {kind for kind, (injected, survived) in report.by_kind().items() if injected == survived}
    assert survived == set(FaultKind) - OBJECT_STORE_KINDS - ACCESS_KINDS
    assert report.failures == []
    assert report.audit is not None and report.audit.steps > 0 and report.audit.samples == report.audit.expected
    assert len(report.gaps_s) == sum(f.kind is FaultKind.KILL_ACTIVE_CONSTRUCTOR for f in report.planned)
    trained = {i for path in (tmp_path / "chaos" / "sinks").glob("received-rank*.jsonl") for i in _trained_ids(path)}
    assert any(i.startswith("captions/") for i in trained), "no image-text pair reached a trainer"


def _trained_ids(path: Path) -> list[str]:
    return [i for line in path.read_text().splitlines() for i in json.loads(line)["sample_ids"]]


def test_the_audit_compares_media_bytes_as_well_as_tokens() -> None:
    frame = bytes(range(256)) * 12  # 32 x 32 RGB
    item = MediaItem("image", 1, 2, 2, 2, 2, 32, 32, 1, "raw", (frame,))
    samples = [Sample("pairs/a.tar/0", "pairs", np.arange(4, dtype=np.int32), {}, (item,))]
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=16, micro_batches=[samples], with_media=True)
    expected = {s.sample_id: sample_sha256(s.tokens, s.media) for s in samples}
    problems: list[str] = []
    check_samples([[batch]], expected, problems)
    assert problems == []

    changed = replace(item, frames=(frame[:-1] + b"\x00",))
    check_samples([[batch]], {"pairs/a.tar/0": sample_sha256(samples[0].tokens, (changed,))}, problems)
    assert any("other tokens or media" in p for p in problems), problems
