"""`mixflow top`: its frame from collected facts, its running tally of the rank topics, the sinks' metrics
endpoints, and (against the broker) `top --once` and `report` on a real job, checked against its topics."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.image import imread
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from rich.console import Console

from pipeline.metrics.endpoints import METRICS_FILE, Endpoint
from pipeline.observe.endpoints import run_endpoints, scrape_sink_steps, sink_steps_in
from pipeline.observe.frame import DEAD_LETTER_ROWS, JobFacts, SourceFacts, build_frame, render_frame
from pipeline.observe.step_stats import step_stats
from pipeline.observe.tally import StepTally
from pipeline.scheduler.cost import CostModel
from pipeline.spec import load_spec
from tests.kafka_support import read_to_end
from tests.loader_support import REPO, build_example_data, write_spec
from tests.observe_support import SOURCES, steps
from topics.batch_codec import decode_batch_message, end_of_data_steps
from topics.errors import MixflowError
from topics.names import JobTopics

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
    letters = draw(st.dictionaries(st.tuples(st.sampled_from(SOURCES), st.text(max_size=200)), st.integers(1, 99)))
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
    counts = [r.records for r in frame.dead_letters]
    assert counts == sorted(counts, reverse=True) and len(counts) == min(DEAD_LETTER_ROWS, len(facts.dead_letters))
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
    assert len(tally.recent) == min(3, len(counted))
    assert set(tally.pending) == (missing if len(job[0]) > 1 else set())  # one rank: nothing arrived


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
