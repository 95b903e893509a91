"""`mixflow top`: its frame from collected facts, its running tally of the rank topics, the sinks' metrics
endpoints, and (against the broker) `top --once` and `report` on a real job, checked against its topics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.image import imread
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from rich.console import Console

from pipeline.cli.control import _wait_for_answer
from pipeline.metrics.endpoints import METRICS_FILE, Endpoint
from pipeline.planning.mixing import MixerState, MixtureChange
from pipeline.planning.step.state import ConstructorState, SourcePosition
from pipeline.spec import load_spec
from pipeline.spec.cost import CostModel
from pipeline.tools.dead_letters import REASONS_SHOWN, reason_kind
from pipeline.tools.observe.collector import JobCollector
from pipeline.tools.observe.endpoints import run_endpoints, scrape_sink_steps, sink_steps_in
from pipeline.tools.observe.frame import Frame, JobFacts, SourceFacts, build_frame, render_frame
from pipeline.tools.observe.lanes import LaneStates
from pipeline.tools.observe.step_stats import step_stats
from pipeline.tools.observe.tally import StepTally
from pipeline.tools.observe.timeline import read_timeline
from pipeline.tools.run.progress import _StepsWritten
from tests.kafka_support import read_to_end
from tests.loader_support import REPO, build_example_data, start_constructor, start_loader, wait_all, write_spec
from tests.observe_support import SOURCES, steps
from tests.ports import free_port
from topics.errors import MixflowError
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.lanes import first_step_at_or_after
from topics.formats.names import JobTopics
from topics.formats.progress import encode_progress
from topics.kafka.admin import ensure_job_topics

COST = CostModel(alpha=1.0, beta=100.0)
WEIGHTS = np.array([0.5, 0.3, 0.2])

source_facts = st.builds(
    SourceFacts,
    name=st.sampled_from(SOURCES),
    end_offset=st.one_of(st.none(), st.integers(0, 10**9)),
    recent_records=st.integers(0, 10**6),
    mean_sample_tokens=st.one_of(st.none(), st.floats(1, 1e5)),
    delivered_offsets=st.one_of(st.none(), st.integers(0, 10**9)),
    loaders=st.one_of(st.none(), st.integers(0, 64)),
    samples=st.integers(0, 10**7),
    tokens=st.integers(0, 10**10),
    scheduled_tokens=st.floats(0, 1e10),
)


@st.composite
def job_facts(draw: st.DrawFn) -> JobFacts:
    recent = [step_stats(b, SOURCES, COST) for b in draw(steps(max_steps=5))]
    reasons = st.one_of(st.text(max_size=200), st.integers(0, 9).map(lambda n: f"image needs {n} tokens"))
    letters = draw(st.dictionaries(st.tuples(st.sampled_from(SOURCES), reasons), st.integers(1, 99), max_size=40))
    return JobFacts(
        job="j",
        window_s=draw(st.floats(0.5, 120)),
        sources=draw(st.lists(source_facts, min_size=1, max_size=3, unique_by=lambda s: s.name)),
        schedule_now=dict(zip(SOURCES, WEIGHTS.tolist(), strict=True)),
        next_step=draw(st.integers(0, 10**6)),
        recent_state_steps=draw(st.integers(0, 1000)),
        finished=draw(st.booleans()),
        recent=recent,
        sink_steps=draw(st.one_of(st.none(), st.lists(st.integers(0, 10**6), min_size=1, max_size=8))),
        dead_letters=letters,
    )


@settings(max_examples=30, deadline=None)
@given(facts=job_facts())
def test_frame_numbers_follow_from_the_facts(facts: JobFacts) -> None:
    frame = build_frame(facts)
    total = sum(s.tokens for s in facts.sources)
    for row, source in zip(frame.sources, facts.sources, strict=True):
        assert row.samples_per_s == pytest.approx(source.recent_records / facts.window_s)
        if source.mean_sample_tokens is None:
            assert row.tokens_per_s is None
        else:
            assert row.tokens_per_s == pytest.approx(row.samples_per_s * source.mean_sample_tokens)
        if source.end_offset is None:
            assert row.backlog is None
        else:
            assert row.backlog == max(0, source.end_offset - (source.delivered_offsets or 0))
        assert (row.share is None) == (total == 0)
        assert row.share_now == facts.schedule_now[source.name]
    if total:
        assert sum(r.share for r in frame.sources) == pytest.approx(1.0)
    c = frame.constructor
    assert c.steps_written == facts.next_step
    assert c.steps_per_s == pytest.approx(facts.recent_state_steps / facts.window_s)
    if facts.sink_steps is None:
        assert c.lead is None
    else:
        assert c.lead == max(0, facts.next_step - 1 - min(facts.sink_steps))
    if facts.recent:
        assert c.imbalance_median == pytest.approx(np.median([s.imbalance for s in facts.recent]))
        assert c.imbalance_max == max(s.imbalance for s in facts.recent)
        assert c.fill_mean == pytest.approx(np.mean([s.fill for s in facts.recent]))
    assert frame.dead_letters_total == sum(facts.dead_letters.values())
    # Every source with dead letters has rows, its kinds of reason the most frequent first, the rest counted in
    # one row: the rows add up to every dead letter, whatever the number of sources and reasons.
    assert sum(r.records for r in frame.dead_letters) == frame.dead_letters_total
    for source in {s for s, _ in facts.dead_letters}:
        rows = [r for r in frame.dead_letters if r.source == source]
        kinds = {reason_kind(reason) for s, reason in facts.dead_letters if s == source}
        assert len(rows) == min(len(kinds), REASONS_SHOWN + 1)
        named = [r.records for r in rows[:REASONS_SHOWN]]
        assert named == sorted(named, reverse=True)
        if len(kinds) > REASONS_SHOWN:
            assert rows[-1].reason == f"({len(kinds) - REASONS_SHOWN} other reasons)"
    text = render_text(frame)
    assert f"job j: sources (rates over the last {facts.window_s:g} s)" in text
    assert ("unknown" in text) == (facts.sink_steps is None)
    assert json.loads(json.dumps(frame.to_dict()))["constructor"]["steps_written"] == facts.next_step


def render_text(frame) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the console
    console.print(render_frame(frame))
    return console.export_text()


def test_frame_refuses_an_empty_rate_window() -> None:
    facts = JobFacts("j", 0.0, [], {}, 0, 0, False, [], None)
    with pytest.raises(ValueError, match=re.escape("rate window must be > 0 s, got 0.0")):
        build_frame(facts)


@settings(max_examples=40, deadline=None)
@given(job=steps(), seed=st.integers(0, 2**32 - 1), held_back=st.integers(0, 3))
def test_tally_counts_a_step_once_every_rank_arrived_in_any_order(job, seed: int, held_back: int) -> None:
    tally = StepTally(SOURCES, len(job[0]), COST, lambda step: WEIGHTS, recent=3)
    arrivals = [b for batches in job for b in batches]
    np.random.default_rng(seed).shuffle(arrivals)
    # Hold back the last rank's batch of some steps: those must not count.
    missing = {batches[-1].step for batches in job[:held_back]}
    for batch in arrivals:
        if not (batch.step in missing and batch.rank == len(job[0]) - 1):
            tally.add(batch)
    counted = [step_stats(b, SOURCES, COST) for b in job if b[0].step not in missing]
    assert tally.steps == len(counted)
    tokens = sum((s.tokens_by_source for s in counted), np.zeros(3, dtype=np.int64))
    np.testing.assert_array_equal(tally.tokens, tokens)
    samples = Counter(s for batches in job if batches[0].step not in missing for b in batches for s in b.sources)
    np.testing.assert_array_equal(tally.samples, [samples[s] for s in SOURCES])
    np.testing.assert_allclose(tally.scheduled, WEIGHTS * tokens.sum())
    # The highest complete steps, whatever order they came in (lanes write steps side by side).
    assert [s.step for s in tally.recent] == sorted(s.step for s in counted)[-3:]
    assert set(tally.pending) == (missing if len(job[0]) > 1 else set())  # one rank: nothing arrived


@st.composite
def lane_states(draw: st.DrawFn) -> tuple[LaneStates, dict[int, int | None], dict[int, int]]:
    """Lanes of a job at one moment: each lane's last written step (None: no state record yet), whether it
    finished, and its position in partition ``p`` of source ``code``; and that partition's end."""
    lanes = draw(st.integers(1, 6))
    base = draw(st.integers(0, 500))
    spread = draw(st.sampled_from([0, 2, 50]))  # lanes close together, or one far behind
    written: dict[int, int | None] = {}
    states = {}
    ends = {}
    for j in range(lanes):
        ends[j] = draw(st.integers(0, 10**6))
        if draw(st.integers(0, 4)) == 0:
            written[j] = None
            continue
        last = first_step_at_or_after(base + draw(st.integers(0, spread)), j, lanes)
        low = draw(st.integers(0, ends[j] + 5))  # a lane's position may be past an end read a moment earlier
        used = tuple(sorted(draw(st.sets(st.integers(low + 1, low + 40), max_size=5))))
        position = {"code": SourcePosition(low, used)} if draw(st.booleans()) else {}
        finished = draw(st.booleans())
        states[j] = ConstructorState(MixerState(last + lanes), position, finished=finished)
        written[j] = last
    return LaneStates(lanes, states), written, ends


@settings(max_examples=60, deadline=None)
@given(lane_states())
def test_lane_states_give_the_job_s_steps_written_finish_and_delivered_offsets(drawn) -> None:
    lanes, written, ends = drawn
    done = [k for k in written.values() if k is not None]
    assert lanes.next_step == (max(done) + 1 if done else 0)
    assert lanes.finished == (len(done) == lanes.lanes and all(s.finished for s in lanes.states.values()))
    positions = {j: s.positions["code"] for j, s in lanes.states.items() if "code" in s.positions}
    delivered = lanes.delivered("code", ends)
    if not positions:
        assert delivered is None
    else:
        assert delivered == sum(min(ends[j], p.low + len(p.used)) for j, p in positions.items())
        backlog = sum(ends.values()) - delivered  # what top shows: per partition, the end less what its lane took
        assert backlog == sum(max(0, ends[j] - (p.low + len(p.used) if (p := positions.get(j)) else 0)) for j in ends)


def test_lane_states_take_the_changes_of_the_lane_that_read_the_most_control_records() -> None:
    early = MixtureChange("a", 10, {"code": 1.0})
    late = MixtureChange("b", 20, {"topics": 1.0})
    behind = ConstructorState(MixerState(9), control_offset=1, changes=(early,))
    ahead = ConstructorState(MixerState(4), control_offset=2, changes=(early, late))
    assert LaneStates(2, {0: ahead, 1: behind}).changes == (early, late)
    assert LaneStates(2, {}).changes == () and LaneStates(2, {}).next_step == 0


def test_sink_steps_from_metrics_files_and_endpoints(tmp_path: Path) -> None:
    assert run_endpoints(tmp_path) == []
    (tmp_path / METRICS_FILE).write_text(json.dumps({"role": "sink"}))
    with pytest.raises(MixflowError, match=re.escape("cannot read the metrics endpoints in")):
        run_endpoints(tmp_path)
    text = (
        "# TYPE mixflow_sink_step gauge\n"
        'mixflow_sink_step{job="j",rank="0"} 7.0\n'
        'mixflow_sink_step{job="j",rank="1"} 5.0\n'
    )
    assert sink_steps_in(text) == [7, 5]
    assert sink_steps_in("# TYPE other gauge\nother 3\n") == []

    registry = CollectorRegistry()
    gauge = Gauge("mixflow_sink_step", "step", ["job", "rank"], registry=registry)
    gauge.labels("j", "0").set(11)
    gauge.labels("j", "1").set(9)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        roles = [
            sink_entry(url),
            {"role": "loader", "name": "load-code-0", "source": "code", "instance": 0, "url": url},
        ]
        (tmp_path / METRICS_FILE).write_text(json.dumps({"roles": roles}))
        endpoints = run_endpoints(tmp_path)
        assert endpoints[0] == Endpoint("sink", "train", None, 0, url)
        assert sorted(scrape_sink_steps(endpoints)) == [9, 11]
        gone = Endpoint("sink", "train", None, 1, f"http://127.0.0.1:{free_port()}/metrics")
        assert scrape_sink_steps([gone]) is None  # nobody answers: the lead is unknown
    finally:
        server.shutdown()
        thread.join(timeout=10)


def sink_entry(url: str) -> dict:
    """A sink's entry in metrics.json, as `mixflow run --metrics-port-base` writes it."""
    return {"role": "sink", "name": "train", "source": None, "instance": 0, "url": url}


def mixflow(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )
    assert result.returncode == 0, f"mixflow {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


@pytest.mark.kafka
def test_top_and_report_agree_with_the_job_topics(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=6)
    spec_path = write_spec(
        tmp_path,
        unique_name,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        mixture={"weights": {"code": 2, "docstrings": 1, "topics": 1}},
        step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512},
    )
    mixflow("run", "--spec", str(spec_path), "--state-dir", str(tmp_path / "state"))
    spec = load_spec(spec_path)
    topics = JobTopics(unique_name)
    batches = [
        decode_batch_message(m)
        for r in range(2)
        for m in read_to_end(kafka_bootstrap, topics.rank(r))
        if end_of_data_steps(m.headers()) is None
    ]
    steps_written = len({b.step for b in batches})
    samples = Counter(s for b in batches for s in b.sources)
    tokens = Counter()
    for b in batches:
        for s, n in zip(b.sources, b.lengths.tolist(), strict=True):
            tokens[s] += n

    # A sink that says it is at step 3: the lead shown is the last step written less 3.
    registry = CollectorRegistry()
    Gauge("mixflow_sink_step", "step", ["job", "rank"], registry=registry).labels(unique_name, "0").set(3)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    run_folder = tmp_path / "state" / "jobs" / unique_name
    run_folder.mkdir(parents=True, exist_ok=True)
    roles = [sink_entry(f"http://127.0.0.1:{port}/metrics")]
    (run_folder / METRICS_FILE).write_text(json.dumps({"roles": roles}))
    try:
        common = ["--spec", str(spec_path), "--run-folder", str(run_folder), "--once"]
        frame = json.loads(mixflow("top", *common, "--json").stdout)
        text = mixflow("top", *common).stdout
    finally:
        server.shutdown()
        thread.join(timeout=10)

    c = frame["constructor"]
    assert c["steps_written"] == steps_written and c["finished"] is True
    assert c["lead"] == steps_written - 1 - 3
    assert re.search(rf"│\s+{steps_written} │.*│\s+{steps_written - 4} │", text), text
    for row in frame["sources"]:
        assert row["samples"] == samples[row["name"]] and row["tokens"] == tokens[row["name"]], row
        assert row["backlog"] == 0, f"a finished job delivered every sample of {row['name']}: {row}"
        assert row["loaders"] == 0  # the loaders have left their groups
        assert re.search(rf"│ {row['name']}\s.*│\s+{samples[row['name']]} │\s+{tokens[row['name']]} │", text), text
    assert sum(r["share"] for r in frame["sources"]) == pytest.approx(1.0)
    assert frame["dead_letters_total"] == len(read_to_end(kafka_bootstrap, topics.dlq))

    out = tmp_path / "report"
    mixflow("report", "--spec", str(spec_path), "--out", str(out))
    summary = (out / "report.md").read_text()
    assert f"| steps | {steps_written} (steps 0-{steps_written - 1}) |" in summary
    assert f"| samples, tokens | {sum(samples.values()):,}, {sum(tokens.values()):,} |" in summary
    for name in ("shares", "imbalance", "fill", "throughput"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({name}.png)" in summary
        assert imread(png).shape[0] > 100
    for source in spec.source_names:
        assert re.search(rf"\| {source} \| {tokens[source]:,} \|", summary), summary


# -- a job of lanes ------------------------------------------------------------------------------------

LANES, LANE_RANKS = 2, 2


def _run_lanes(spec: Path, job: str, folder: Path, *extra_by_lane: tuple[str, ...]) -> None:
    log = folder / "constructors.log"
    processes = [
        start_constructor(spec, job, "--lane", str(j), *extra, log=log) for j, extra in enumerate(extra_by_lane)
    ]
    for process in processes:
        try:
            code = process.wait(timeout=240)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise AssertionError(f"the lanes did not stop in 240 s; the log ends:\n{log.read_text()[-3000:]}") from None
        assert code == 0, log.read_text()[-3000:]


def _check_top_against_topics(facts: JobFacts, bootstrap: str, job: str, window_s: float) -> Frame:
    """Top's numbers from what every partition of the job's topics holds: steps written, per source
    backlog (each partition's end less what its lane's last state says it consumed), samples, tokens."""
    frame = build_frame(facts)
    topics = JobTopics(job)
    batches = [
        decode_batch_message(m)
        for r in range(LANE_RANKS)
        for m in read_to_end(bootstrap, topics.rank(r))
        if end_of_data_steps(m.headers()) is None
    ]
    steps = sorted({b.step for b in batches})
    assert {b.step % LANES for b in batches} == set(range(LANES)), "both lanes wrote steps"
    states = {m.partition(): ConstructorState.from_bytes(m.value()) for m in read_to_end(bootstrap, topics.state)}
    c = frame.constructor
    assert c.steps_written == steps[-1] + 1, (c, steps)
    assert c.steps_per_s * window_s == pytest.approx(len(steps)), "every lane's steps were committed in the window"
    assert c.finished == (len(states) == LANES and all(s.finished for s in states.values()))
    assert [s.step for s in facts.recent] == steps[-len(facts.recent) :] and facts.recent
    samples = Counter(s for b in batches for s in b.sources)
    tokens = Counter()
    for b in batches:
        for s, n in zip(b.sources, b.lengths.tolist(), strict=True):
            tokens[s] += n
    for row in frame.sources:
        ends = {}
        for m in read_to_end(bootstrap, topics.src(row.name)):
            ends[m.partition()] = m.offset() + 1  # past the partition's last committed sample
        consumed = {p: s.positions[row.name] for p, s in states.items() if row.name in s.positions}
        taken = {p: position.low + len(position.used) for p, position in consumed.items()}
        backlog = sum(end - taken.get(p, 0) for p, end in ends.items())
        assert row.backlog == backlog, (row, ends, consumed)
        assert row.samples == samples[row.name] and row.tokens == tokens[row.name], row
    return frame


def _progress_steps(config: dict, job: str, expected: int, timeout_s: float = 30.0) -> int:
    """The steps ``mixflow run``'s progress shows as written, once it shows ``expected`` or ``timeout_s`` passed."""
    written = _StepsWritten(config, job)
    deadline = time.monotonic() + timeout_s
    try:
        while (steps := written.poll()) != expected and time.monotonic() < deadline:
            time.sleep(0.1)  # the progress line polls without waiting: so does this
        return steps
    finally:
        written.close()


def _set_mixture(spec: Path, from_step: int, *shares: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pipeline.cli", "control", "set-mixture", "--spec", str(spec)]
    command += ["--from-step", str(from_step), "--wait-s", "0", *shares]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.kafka
def test_top_and_set_mixture_follow_every_lane_of_a_job(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=8)
    for path in (data / "code").glob("*.parquet"):  # row groups of 2 rows: units enough for every lane
        pq.write_table(pq.read_table(path), path, row_group_size=2)
    step = {"ranks": LANE_RANKS, "micro_batches": 1, "tokens_per_micro_batch": 512}
    spec_path = write_spec(
        tmp_path, unique_name, kafka_bootstrap, data, on_exhausted="renormalize", step=step, constructor={"lanes": 2}
    )
    spec = load_spec(spec_path)
    config = spec.kafka.client_config(kafka_bootstrap)
    ensure_job_topics(kafka_bootstrap, unique_name, spec.source_names, LANE_RANKS, lanes=LANES, timeout_s=120)
    loaders = [start_loader(spec_path, s, 0, tmp_path, "--unit-seconds", "0.005") for s in spec.source_names]
    wait_all(loaders, 240, tmp_path)
    window_s = 3600.0  # every step of the test falls in it
    collector = JobCollector(config, spec, window_s=window_s)
    try:
        # Lanes that stopped at different steps: lane 0 wrote steps 0, 2 and 4, lane 1 step 1 only.
        _run_lanes(spec_path, unique_name, tmp_path, ("--max-steps", "3"), ("--max-steps", "1"))
        frame = _check_top_against_topics(collector.collect(budget_s=120), kafka_bootstrap, unique_name, window_s)
        assert frame.constructor.steps_written == 5 and not frame.constructor.finished
        assert _progress_steps(config, unique_name, 5) == 5  # `mixflow run`'s progress line counts every lane
        assert sum(r.backlog for r in frame.sources) > 0, "the lanes stopped with samples left in both partitions"

        # Lane 0 wrote step 4: a change from step 4 is too late for it; from 5, every lane takes it in time.
        late = _set_mixture(spec_path, 4, "code=1")
        assert late.returncode == 5 and "a constructor lane is past step 4" in late.stderr, late.stderr
        published = _set_mixture(spec_path, 5, "code=1")
        assert published.returncode == 0, published.stderr
        change = json.loads(published.stdout.splitlines()[-1])["change"]

        _run_lanes(spec_path, unique_name, tmp_path, (), ())
        facts = collector.collect(budget_s=120)
        frame = _check_top_against_topics(facts, kafka_bootstrap, unique_name, window_s)
        assert frame.constructor.finished
        states = {m.partition(): m.value() for m in read_to_end(kafka_bootstrap, JobTopics(unique_name).state)}
        for lane, state in states.items():
            changes = ConstructorState.from_bytes(state).changes
            assert [(c.id, c.from_step) for c in changes] == [(change, 5)], f"lane {lane}: {changes}"
        assert _wait_for_answer(config, JobTopics(unique_name), change, 5, lanes=LANES) == "accepted"
        assert facts.schedule_now == {"code": 1.0, "docstrings": 0.0, "topics": 0.0}
        # The report's backlog at the last step counts every lane's deliveries, as top does (less a commit
        # marker after each partition's last sample, which top leaves out).
        timeline = read_timeline(config, spec)
        rank_0 = read_to_end(kafka_bootstrap, JobTopics(unique_name).rank(0))
        steps = sorted(decode_batch_message(m).step for m in rank_0 if end_of_data_steps(m.headers()) is None)
        assert [s.step for s in timeline.stats] == steps
        for i, row in enumerate(frame.sources):
            assert 0 <= timeline.backlog[-1][i] - row.backlog <= LANES, (timeline.backlog[-1], frame.sources)
        steps_written = frame.constructor.steps_written
        assert _progress_steps(config, unique_name, steps_written) == steps_written
        finished = _set_mixture(spec_path, 10**6, "code=1")
        assert finished.returncode == 5 and f"finished at step {frame.constructor.steps_written}" in finished.stderr
    finally:
        collector.close()


@pytest.mark.kafka
def test_without_sink_endpoints_the_lead_comes_from_the_progress_reports(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    data = build_example_data(tmp_path / "data", limit=2)
    step = {"ranks": 3, "micro_batches": 1, "tokens_per_micro_batch": 512}
    spec = load_spec(write_spec(tmp_path, unique_name, kafka_bootstrap, data, step=step))
    ensure_job_topics(kafka_bootstrap, unique_name, spec.source_names, 3)
    collector = JobCollector(spec.kafka.client_config(kafka_bootstrap), spec)
    assert collector.collect(budget_s=30).sink_steps is None  # no endpoint, no report: the lead is unknown
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for rank, step in [(0, 2), (1, 4), (0, 6), (2, 9), (2, 5)]:  # the latest report of a rank counts
        key, value = encode_progress(rank, step)
        producer.produce(JobTopics(unique_name).progress, value, key=key)
    producer.produce(JobTopics(unique_name).progress, b"not json", key=b"7")  # left out
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 60
    while (steps := collector.collect(budget_s=30).sink_steps) != [6, 4, 5]:
        assert time.monotonic() < deadline, f"the reports did not arrive within 60 s: {steps}"
