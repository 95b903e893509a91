"""Prometheus metrics of every role: names that follow the conventions, counts that follow the roles'
transactions, and, against the real broker, endpoints whose numbers agree with what a job wrote."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.metrics import DeadLetterReason, RunMetrics, read_endpoints, reason_class, role_registry, serve_metrics
from pipeline.metrics.endpoints import RoleRestarts
from pipeline.planning.mixing import MixerState
from pipeline.planning.shape import StepShape
from pipeline.planning.step.assemble import assemble_step
from pipeline.planning.step.pool import Candidate, SamplePool
from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition
from pipeline.roles.autoscale.metrics import AutoscalerMetrics
from pipeline.roles.autoscale.policy import Decision
from pipeline.roles.constructor.metrics import ConstructorMetrics, SourceBacklog, SourceHolding, backlog_tokens
from pipeline.roles.loader.metrics import LoaderMetrics, WorkUnitLag, work_unit_lag
from pipeline.spec.cost import CostModel
from pipeline.spec.sections import StepSpec
from pipeline.tools.stack.local_broker import free_port_block
from tests.loader_support import REPO, build_example_data, start_constructor, write_spec
from tests.ports import free_port
from topics.errors import MixflowError
from topics.formats.batch_codec import decode_batch_message
from topics.formats.dead_letter import DeadLetter, decode_dead_letter_message
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end
from trainer_sink import KafkaBatchDataset
from trainer_sink.deliveries import Delivery
from trainer_sink.metrics import SinkMetrics

SHAPE = StepSpec(ranks=2, micro_batches=2, tokens_per_micro_batch=64)
COST = CostModel(alpha=1.0, beta=100.0)


def job_spec(sources: tuple[str, ...]) -> SimpleNamespace:
    """What ConstructorMetrics reads of a JobSpec."""
    return SimpleNamespace(step=SHAPE, cost=SimpleNamespace(cost_model=lambda: COST), source_names=list(sources))


LABELS = {"job", "source", "rank", "reason", "role"}
# What a name may end with: the unit or the thing counted.
GAUGE_ENDINGS = ("_seconds", "_bytes", "_tokens", "_samples", "_ratio", "_cost", "_step", "_active", "_lag")
GAUGE_ENDINGS += ("_loaders", "_per_second")
COUNTER_ENDINGS = ("_samples", "_tokens", "_units", "_transactions", "_steps", "_letters", "_takeovers", "_fencings")
COUNTER_ENDINGS += ("_restarts", "_batches")


# -- helpers -----------------------------------------------------------------------------------------


def samples_of(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a text exposition, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return samples_of(response.read().decode())


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    logs: Callable[[], str] = str,
    running: list[subprocess.Popen] | None = None,
) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s`` or as soon as one of ``running`` has exited."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s\n{logs()}")
        if ended := [p.args for p in running or [] if p.poll() is not None]:
            raise AssertionError(f"{what}: a role exited first: {ended}\n{logs()}")
        time.sleep(0.2)  # polling HTTP endpoints and topics: nothing to wait on


def families(registry: CollectorRegistry, collectors: tuple = ()) -> list:
    """The registry's metric families as exposed, plus those ``collectors`` describe (without Kafka)."""
    found = list(text_string_to_metric_families(generate_latest(registry).decode()))
    for collector in collectors:
        found += list(collector.describe())
    return found


def all_role_registries() -> list[tuple[CollectorRegistry, tuple]]:
    out = []
    r = CollectorRegistry()
    LoaderMetrics(r, "j", "code")
    out.append((r, (WorkUnitLag({}, JobTopics("j"), "code"),)))
    r = CollectorRegistry()
    constructor = ConstructorMetrics(r, "j", job_spec(("code", "docs")))
    out.append((r, (SourceBacklog({}, JobTopics("j"), ["code"], constructor),)))
    r = CollectorRegistry()
    SinkMetrics(r, "j", 0)
    out.append((r, ()))
    r = CollectorRegistry()
    AutoscalerMetrics(r, "j").decided(Decision("code", 1, 2, 10.0, 5.0, 0.5, "behind"))
    out.append((r, ()))
    r = CollectorRegistry()
    out.append((r, (RoleRestarts("j", [SimpleNamespace(name="load-code-0", restarts=2)]),)))
    return out


# -- names and labels ----------------------------------------------------------------------------------


def test_every_metric_follows_the_prometheus_conventions() -> None:
    seen = set()
    for registry, collectors in all_role_registries():
        for family in families(registry, collectors):
            name = family.name
            if family.type == "gauge" and name.endswith("_created"):
                continue  # prometheus-client's creation time of a counter or histogram
            seen.add(name)
            assert re.fullmatch(r"mixflow_(loader|constructor|sink|run|autoscaler|dead_letters)[a-z_]*", name), name
            assert "_total" not in name, f"{name}: the family name carries no _total (its samples do)"
            for sample in family.samples:
                assert set(sample.labels) <= LABELS | {"le"}, (name, sample.labels)
            if family.type == "counter":
                assert name.endswith(COUNTER_ENDINGS), f"counter {name} does not name what it counts"
                exposed = {s.name for s in family.samples}
                assert exposed <= {f"{name}_total", f"{name}_created"}, exposed
            elif family.type == "histogram":
                assert name.endswith(("_seconds", "_ratio")), f"histogram {name} has no unit"
            else:
                assert family.type == "gauge", (name, family.type)
                assert name.endswith(GAUGE_ENDINGS), f"gauge {name} has no unit or counted thing"
            assert family.documentation, f"{name} has no help text"
    # The metrics the docs list, each defined somewhere.
    for wanted in (
        "mixflow_loader_samples",
        "mixflow_loader_tokens",
        "mixflow_loader_work_units",
        "mixflow_loader_work_units_lag",
        "mixflow_loader_transaction_seconds",
        "mixflow_dead_letters",
        "mixflow_constructor_backlog_tokens",
        "mixflow_constructor_last_step",
        "mixflow_constructor_last_step_max_rank_cost",
        "mixflow_constructor_last_step_fill_ratio",
        "mixflow_constructor_step_imbalance_ratio",
        "mixflow_constructor_deferred_samples",
        "mixflow_constructor_packed_steps",
        "mixflow_constructor_transaction_seconds",
        "mixflow_constructor_consumed_tokens",
        "mixflow_constructor_active",
        "mixflow_sink_micro_batches",
        "mixflow_sink_tokens",
        "mixflow_sink_step",
        "mixflow_sink_wait_seconds",
        "mixflow_sink_prefetch_bytes",
        "mixflow_run_role_restarts",
        "mixflow_autoscaler_desired_loaders",
        "mixflow_autoscaler_loaders",
        "mixflow_autoscaler_demand_tokens_per_second",
        "mixflow_autoscaler_supply_tokens_per_second",
    ):
        assert wanted in seen, wanted


decisions = st.builds(
    Decision,
    source=st.sampled_from(["code", "docs", "web"]),
    loaders=st.integers(0, 64),
    desired=st.integers(0, 64),
    demand=st.floats(0, 1e9),
    supply=st.floats(0, 1e9),
    backlog_s=st.floats(0, 1e4),
    reason=st.text(max_size=20),
)


@given(st.lists(decisions, max_size=12))
def test_the_autoscaler_gauges_hold_each_source_s_latest_decision_in_a_registry_of_their_own(
    history: list[Decision],
) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    metrics = AutoscalerMetrics(first, "j")
    AutoscalerMetrics(second, "other")  # a second autoscaler in the same process: no clash
    latest = {}
    for decision in history:
        metrics.decided(decision)
        latest[decision.source] = decision
    exposed = samples_of(generate_latest(first).decode())
    assert len(exposed) == 4 * len(latest)
    for source, d in latest.items():
        for name, expected in (
            ("mixflow_autoscaler_desired_loaders", d.desired),
            ("mixflow_autoscaler_loaders", d.loaders),
            ("mixflow_autoscaler_demand_tokens_per_second", d.demand),
            ("mixflow_autoscaler_supply_tokens_per_second", d.supply),
        ):
            assert value(exposed, name, job="j", source=source) == pytest.approx(expected), name
    assert samples_of(generate_latest(second).decode()) == {}


def test_a_role_registry_holds_the_process_metrics() -> None:
    names = {f.name for f in text_string_to_metric_families(generate_latest(role_registry()).decode())}
    assert {"process_cpu_seconds", "process_start_time_seconds"} <= names


# -- dead-letter reasons -------------------------------------------------------------------------------

# Reasons as the readers in connectors/ and the roles write them.
KNOWN_REASONS = {
    "cannot read: [Errno 2] No such file or directory: 'x.txt'": DeadLetterReason.UNREADABLE_FILE,
    "cannot open as Parquet: Parquet magic bytes not found": DeadLetterReason.UNREADABLE_FILE,
    "cannot read row group: IOError": DeadLetterReason.UNREADABLE_FILE,
    "cannot open as Arrow IPC: not an Arrow file": DeadLetterReason.UNREADABLE_FILE,
    "file ends at row 3, before row 9 of a.jsonl:0-9": DeadLetterReason.TRUNCATED_FILE,
    "file has 3 rows, fewer than the 9 of a.arrow:0-9": DeadLetterReason.TRUNCATED_FILE,
    "row group 4 planned, but the file has 2": DeadLetterReason.TRUNCATED_FILE,
    "not UTF-8: byte 3 (b'\\xff')": DeadLetterReason.NOT_UTF8,
    "invalid JSON: Expecting value: line 1 column 1 (char 0)": DeadLetterReason.INVALID_JSON,
    "line is a JSON list, not an object": DeadLetterReason.INVALID_JSON,
    "field 'text' is missing or null": DeadLetterReason.MISSING_FIELD,
    "no column 'text' (columns: a, b)": DeadLetterReason.MISSING_FIELD,
    "field 'text' is int, not a string": DeadLetterReason.WRONG_TYPE,
    "column 'text' has type int64, expected string": DeadLetterReason.WRONG_TYPE,
    "field 'tokens' holds token ids outside [0, 2**31)": DeadLetterReason.BAD_TOKENS,
    "token ids outside [0, 2**31)": DeadLetterReason.BAD_TOKENS,
    "field 'tokens' is not a flat list of integers (got float64 with 1 dimensions)": DeadLetterReason.BAD_TOKENS,
    "document has no tokens": DeadLetterReason.EMPTY_DOCUMENT,
    "undecodable work unit: not JSON": DeadLetterReason.BAD_WORK_UNIT,
}


@pytest.mark.parametrize(("reason", "expected"), list(KNOWN_REASONS.items()))
def test_the_readers_reasons_fall_into_their_class(reason: str, expected: DeadLetterReason) -> None:
    assert reason_class(reason) is expected


@given(st.sampled_from(list(KNOWN_REASONS.items())), st.text(max_size=40))
def test_a_reasons_class_does_not_depend_on_its_details(known: tuple[str, DeadLetterReason], tail: str) -> None:
    reason, expected = known
    assert reason_class(reason + tail) is expected


@given(st.text(max_size=200))
def test_any_reason_has_one_of_a_fixed_set_of_classes(reason: str) -> None:
    assert reason_class(reason) in set(DeadLetterReason)


# -- pure cores ----------------------------------------------------------------------------------------


@given(st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, 1000), st.integers(-1001, 1000)), max_size=16))
def test_work_unit_lag_counts_what_the_group_has_not_committed(parts: dict[int, tuple[int, int]]) -> None:
    ends = {p: end for p, (end, _) in parts.items()}
    committed = {p: c for p, (_, c) in parts.items()}
    expected = sum(max(0, end - max(c, 0)) for end, c in parts.values())
    assert work_unit_lag(ends, committed) == expected
    assert work_unit_lag(ends, {}) == sum(ends.values())
    assert work_unit_lag(ends, ends) == 0


@given(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 10**4), st.floats(0, 4096))
def test_backlog_is_what_is_held_plus_what_is_unread(held: int, next_offset: int, end: int, mean: float) -> None:
    backlog = backlog_tokens(SourceHolding(held, next_offset, mean), end)
    assert backlog >= held
    assert backlog == pytest.approx(held + max(0, end - next_offset) * mean)


# -- counts follow transactions ------------------------------------------------------------------------

transactions = st.lists(
    st.tuples(
        st.booleans(),  # committed
        st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5000)), max_size=4),  # units: samples, tokens
        st.lists(st.sampled_from(list(KNOWN_REASONS)), max_size=3),  # dead letters
    ),
    max_size=12,
)


@given(transactions)
def test_loader_counts_only_what_committed(history: list) -> None:
    registry = CollectorRegistry()
    metrics = LoaderMetrics(registry, "j", "code")
    for committed, units, reasons in history:
        metrics.letters_produced(DeadLetter("code", "a.txt", r) for r in reasons)
        if committed:
            for samples, tokens in units:
                metrics.unit_committed(samples, tokens)
        metrics.transaction_ended(committed, 0.01)
    got = samples_of(generate_latest(registry).decode())
    done = [h for h in history if h[0]]
    labels = {"job": "j", "source": "code"}
    assert value(got, "mixflow_loader_samples_total", **labels) == sum(s for h in done for s, _ in h[1])
    assert value(got, "mixflow_loader_tokens_total", **labels) == sum(t for h in done for _, t in h[1])
    assert value(got, "mixflow_loader_work_units_total", **labels) == sum(len(h[1]) for h in done)
    assert value(got, "mixflow_loader_aborted_transactions_total", **labels) == len(history) - len(done)
    assert value(got, "mixflow_loader_transaction_seconds_count", **labels) == len(done)
    letters = Counter(KNOWN_REASONS[r].value for h in done for r in h[2])
    for reason in DeadLetterReason:
        expected = letters.get(reason.value)
        assert value(got, "mixflow_dead_letters_total", reason=reason.value, **labels) == expected


def _sample(source: str, i: int, length: int) -> Sample:
    return Sample(f"{source}/f/{i}", source, np.arange(length, dtype=np.int32))


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 300)), max_size=40), st.integers(0, 40))
def test_constructor_counts_tokens_read_and_holds_a_backlog(reads: list[tuple[str, int]], resume_at: int) -> None:
    registry = CollectorRegistry()
    metrics = ConstructorMetrics(registry, "j", job_spec(("a", "b")))
    state = ConstructorState(MixerState.initial(("a", "b")), {"a": SourcePosition(0, ()), "b": SourcePosition(0, ())})
    pool = SamplePool(state)
    offsets = {"a": 0, "b": 0}
    for i, (source, length) in enumerate(reads):
        if i == resume_at:  # a resume reads into a new pool; counting goes on from there
            pool = SamplePool(state)
        pool.add(source, offsets[source], _sample(source, i, length))
        offsets[source] += 1
        metrics.look_at_pool(pool)
    got = samples_of(generate_latest(registry).decode())
    for source in ("a", "b"):
        read = sum(n for s, n in reads if s == source)
        assert value(got, "mixflow_constructor_consumed_tokens_total", job="j", source=source) == read
    metrics._pool_look_at = -1.0  # the next look sums the pool, however soon
    metrics.look_at_pool(pool)
    for source, holding in metrics.holdings.items():
        fifo = pool.fifos[source]
        assert holding.held_tokens == sum(fifo.lengths)
        assert holding.next_offset == fifo.next_offset


@settings(deadline=None, max_examples=30)  # each example assembles up to 6 steps; the first compiles the kernels
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 64)), max_size=8), max_size=6))
def test_constructor_counts_each_committed_step(steps: list[list[tuple[str, int]]]) -> None:
    registry = CollectorRegistry()
    metrics = ConstructorMetrics(registry, "j", job_spec(("a", "b")))
    delivered = []
    for k, samples in enumerate(steps):
        candidates = [Candidate(SampleRef(s, i), _sample(s, i, n)) for i, (s, n) in enumerate(samples)]
        assembled = assemble_step(k, candidates, StepShape.from_spec(SHAPE), COST)
        metrics.step_committed(assembled.summary(), [DeadLetter("a", f"t[0]@{k}", "unknown schema")])
        delivered.append(assembled)
    metrics.step_committed(None, [])  # the final state alone: no step
    got = samples_of(generate_latest(registry).decode())
    assert value(got, "mixflow_constructor_steps_total", job="j") == len(steps)
    assert value(got, "mixflow_constructor_last_step", job="j") == len(steps) - 1
    assert value(got, "mixflow_constructor_step_fill_ratio_count", job="j") == len(steps)
    letters = {"job": "j", "source": "a", "reason": DeadLetterReason.UNDECODABLE_SAMPLE.value}
    assert value(got, "mixflow_dead_letters_total", **letters) == (len(steps) or None)
    for source in ("a", "b"):
        written = [c.sample.length for a in delivered for c in a.delivered if c.ref.source == source]
        assert value(got, "mixflow_constructor_samples_total", job="j", source=source) == len(written)
        assert value(got, "mixflow_constructor_tokens_total", job="j", source=source) == sum(written)
    deferred = sum(len(a.deferred) for a in delivered)
    assert value(got, "mixflow_constructor_deferred_samples_total", job="j") == deferred
    if steps:
        last = delivered[-1]
        costs = last.plan.rank_costs(last.lengths, COST)
        fill = sum(c.sample.length for c in last.delivered) / SHAPE.tokens_per_step
        assert value(got, "mixflow_constructor_last_step_fill_ratio", job="j") == pytest.approx(fill)
        assert value(got, "mixflow_constructor_last_step_max_rank_cost", job="j") == pytest.approx(costs.max())
        assert value(got, "mixflow_constructor_last_step_imbalance_ratio", job="j") >= 1.0
        assert value(got, "mixflow_constructor_waiting_deferred_samples", job="j") == len(last.deferred)


@given(st.lists(st.lists(st.integers(1, 100), max_size=5), min_size=1, max_size=10))
def test_sink_counts_what_it_hands_out(micro_batches: list[list[int]]) -> None:
    registry = CollectorRegistry()
    metrics = SinkMetrics(registry, "j", 1)
    deliveries = []
    for i, lengths in enumerate(micro_batches):
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        deliveries.append(Delivery({"cu_seqlens": cu}, i, i // 2, i % 2, 2, 2))
    for delivery in metrics.noting_tokens(iter(deliveries)):
        metrics.handed_out(delivery, 0.002)
    got = samples_of(generate_latest(registry).decode())
    labels = {"job": "j", "rank": "1"}
    assert value(got, "mixflow_sink_micro_batches_total", **labels) == len(micro_batches)
    assert value(got, "mixflow_sink_tokens_total", **labels) == sum(map(sum, micro_batches))
    assert value(got, "mixflow_sink_step", **labels) == (len(micro_batches) - 1) // 2
    assert value(got, "mixflow_sink_wait_seconds_count", **labels) == len(micro_batches)


# -- endpoints -----------------------------------------------------------------------------------------


def test_a_port_taken_or_out_of_range_is_refused_with_its_number() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MixflowError, match=f"port {port}"):
            serve_metrics(CollectorRegistry(), port, "loader code 0")
    with pytest.raises(MixflowError, match="70000"):
        serve_metrics(CollectorRegistry(), 70000, "loader code 0")
    assert serve_metrics(CollectorRegistry(), 0, "off") is None
    with pytest.raises(MixflowError, match="--metrics-port-base"):
        RunMetrics(Path("."), "j", -3)


@settings(deadline=None)  # writes files: slow on a loaded disk
@given(st.lists(st.sampled_from(["loader", "constructor", "sink"]), max_size=12))
def test_run_metrics_give_distinct_ports_listed_in_metrics_json(roles: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        metrics = RunMetrics(Path(folder), "j", 20000)
        ports = [
            metrics.port(role, f"{role}-{i}", "code" if role == "loader" else None, i) for i, role in enumerate(roles)
        ]
        assert ports == list(range(20000, 20000 + len(roles)))
        if roles:
            listed = read_endpoints(Path(folder) / "metrics.json")
            assert [e.url for e in listed] == [f"http://127.0.0.1:{p}/metrics" for p in ports]
            assert [e.role for e in listed] == roles
        off = RunMetrics(Path(folder) / "off", "j", 0)
        assert off.port_flag("loader", "load-code-0", "code", 0) == []
        assert not (Path(folder) / "off" / "metrics.json").exists()


def test_metrics_json_is_what_mixflow_top_reads(tmp_path: Path) -> None:
    from pipeline.tools.observe.endpoints import run_endpoints as top_reads

    metrics = RunMetrics(tmp_path, "j", 21000)
    metrics.port_flag("loader", "load-code-0", "code", 0)
    metrics.port_flag("constructor", "construct", None, 0)
    metrics.sink_ports(2)
    read = top_reads(tmp_path)
    assert [(e.role, e.source) for e in read] == [
        ("loader", "code"),
        ("constructor", None),
        ("sink", None),
        ("sink", None),
    ]
    assert read[2].url == "http://127.0.0.1:21002/metrics"


def test_a_trainer_command_gets_the_first_sink_port(tmp_path: Path) -> None:
    from pipeline.tools.run.job import trainer_command

    metrics = RunMetrics(tmp_path, "j", 22000)
    metrics.port("supervisor", "run")
    first = metrics.sink_ports(3)
    command = trainer_command("{python} train.py --metrics-port {metrics_port}", Path("s.yaml"), tmp_path, first)
    assert command[-2:] == ["--metrics-port", "22001"]
    sinks = [e for e in read_endpoints(tmp_path / "metrics.json") if e.role == "sink"]
    assert [(e.instance, e.url) for e in sinks] == [(r, f"http://127.0.0.1:{22001 + r}/metrics") for r in range(3)]
    assert RunMetrics(tmp_path / "off", "j", 0).sink_ports(3) == 0


def test_the_supervisor_serves_role_restarts(tmp_path: Path) -> None:
    base = free_port()
    metrics = RunMetrics(tmp_path, "j", base)
    roles = [SimpleNamespace(name="load-code-0", restarts=0), SimpleNamespace(name="construct", restarts=0)]
    metrics.watch(roles)
    metrics.serve()
    try:
        url = f"http://127.0.0.1:{base}/metrics"
        roles[1].restarts = 2
        roles.append(SimpleNamespace(name="load-code-1", restarts=1))  # started later (autoscaling)
        got = scrape(url)
        for role in roles:
            assert value(got, "mixflow_run_role_restarts_total", job="j", role=role.name) == role.restarts
        assert read_endpoints(tmp_path / "metrics.json")[0].role == "supervisor"
    finally:
        metrics.close()


# -- against the broker --------------------------------------------------------------------------------

STALL_AT = 3  # steps written before the job waits for a source that has no loader


def _start_loader(spec: Path, source: str, port: int, log: Path) -> subprocess.Popen:
    """A loader that stays up when its source is done (no --until-drained), serving metrics on ``port``."""
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec), "--source", source]
    command += ["--metrics-port", str(port), "--transaction-timeout-ms", "10000"]
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=REPO)


def _source_totals(bootstrap: str, topics: JobTopics, source: str) -> tuple[int, int]:
    samples = [decode_sample_message(m) for m in read_to_end({"bootstrap.servers": bootstrap}, topics.src(source))]
    return len(samples), sum(s.length for s in samples)


def _rank_totals(bootstrap: str, topics: JobTopics, ranks: int) -> dict[tuple[int, str], tuple[int, int]]:
    """Per (rank, source): samples and tokens in the rank topics."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    for rank in range(ranks):
        for message in read_to_end({"bootstrap.servers": bootstrap}, topics.rank(rank)):
            records = decode_batch_message(message).records
            lengths = records.column("tokens").value_lengths().to_numpy()
            for source, length in zip(records.column("source").to_pylist(), lengths, strict=True):
                n, t = out.get((rank, source), (0, 0))
                out[(rank, source)] = (n + 1, t + int(length))
    return out


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen]]:
    running: list[subprocess.Popen] = []
    try:
        yield running
    finally:
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_role_endpoints_agree_with_what_the_job_wrote(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    """Loaders of two sources and the constructor run with metrics ports; the mixture turns to a third
    source (never loaded) at step STALL_AT, so the job holds still there, every role up, and each
    endpoint's counts can be compared with the topics exactly. A sink then reads rank 0 and is scraped."""
    data = build_example_data(tmp_path / "data", limit=12)
    # Two bad records: dead letters of two reasons.
    (data / "docstrings" / "bad.jsonl").write_text('not JSON\n{"text": 5}\n{"text": "fine"}\n')
    schedule = [
        {"step": 0, "weights": {"code": 1, "docstrings": 1}},
        {"step": STALL_AT, "weights": {"topics": 1}},
    ]
    spec = write_spec(
        tmp_path,
        unique_name,
        kafka_bootstrap,
        data,
        mixture={"schedule": schedule, "interpolation": "constant"},
        composition=None,
        step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512},
    )
    topics = JobTopics(unique_name)
    ports = {"code": free_port(), "docstrings": free_port(), "constructor": free_port(), "sink": free_port()}
    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}

    last: dict[str, object] = {}  # each endpoint's last answer or error, for a failure's message

    def logs() -> str:
        answered = {
            name: {k[0]: v for k, v in got.items() if k[0].startswith("mixflow")} if isinstance(got, dict) else got
            for name, got in last.items()
        }
        return f"last scrapes: {answered}\n" + "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("*.log")))

    def answers(name: str) -> dict | None:
        try:
            last[name] = scrape(urls[name])
        except (urllib.error.URLError, OSError) as exc:
            last[name] = repr(exc)
            return None
        return last[name]

    with _processes() as running:
        for source in ("code", "docstrings"):
            running.append(_start_loader(spec, source, ports[source], tmp_path / f"load-{source}.log"))
        running.append(
            start_constructor(
                spec, unique_name, "--metrics-port", str(ports["constructor"]), log=tmp_path / "construct.log"
            )
        )
        job, steps = {"job": unique_name}, "mixflow_constructor_steps_total"
        wait_until(
            f"the constructor's {steps} reaching {STALL_AT}",
            lambda: (got := answers("constructor")) is not None and value(got, steps, **job) == STALL_AT,
            timeout_s=180,
            logs=logs,
            running=running,
        )
        for source in ("code", "docstrings"):
            lag = "mixflow_loader_work_units_lag"
            wait_until(
                f"{source}'s work units all done",
                lambda s=source, m=lag: (got := answers(s)) is not None and value(got, m, source=s, **job) == 0,
                timeout_s=60,
                logs=logs,
                running=running,
            )

        # The backlog gauge adds the source topic's end to the pool's holdings, which the constructor samples at
        # most every POOL_LOOK_S: right after the stall, the last sample can still be one from before its steps.
        backlog = "mixflow_constructor_backlog_tokens"

        def backlog_agrees() -> bool:
            got = answers("constructor")
            ranks = _rank_totals(kafka_bootstrap, topics, 2)
            for source in ("code", "docstrings", "topics"):
                tokens = sum(t for (_, s), (_, t) in ranks.items() if s == source)
                in_topic = _source_totals(kafka_bootstrap, topics, source)[1]
                measured = None if got is None else value(got, backlog, source=source, **job)
                if measured is None or abs(measured - (in_topic - tokens)) > 0.1 * in_topic + 1024:
                    return False
            return True

        wait_until(f"the constructor's {backlog} sampled at the stall", backlog_agrees, 30, logs, running)

        # Loaders: what they count is what their source topics hold.
        dead = Counter(
            (d.source, reason_class(d.reason).value)
            for d in map(decode_dead_letter_message, read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.dlq))
        )
        assert dead[("docstrings", "invalid_json")] == dead[("docstrings", "wrong_type")] == 1
        for source in ("code", "docstrings"):
            got = scrape(urls[source])
            labels = {"source": source, **job}
            samples, tokens = _source_totals(kafka_bootstrap, topics, source)
            assert samples > 0
            assert value(got, "mixflow_loader_samples_total", **labels) == samples
            assert value(got, "mixflow_loader_tokens_total", **labels) == tokens
            units = len(read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.work(source)))
            assert value(got, "mixflow_loader_work_units_total", **labels) == units
            for reason in DeadLetterReason:
                counted = value(got, "mixflow_dead_letters_total", reason=reason.value, **labels)
                assert (counted or 0) == dead[(source, reason.value)], (source, reason)
            assert value(got, "mixflow_loader_transaction_seconds_count", **labels) >= 1
            assert value(got, "process_cpu_seconds_total") > 0

        # Constructor: what it counts is what the rank topics hold.
        got = scrape(urls["constructor"])
        ranks = _rank_totals(kafka_bootstrap, topics, 2)
        assert value(got, "mixflow_constructor_last_step", **job) == STALL_AT - 1
        assert value(got, "mixflow_constructor_active", **job) == 1
        assert value(got, "mixflow_constructor_transaction_seconds_count", **job) == STALL_AT
        assert 0 < value(got, "mixflow_constructor_last_step_fill_ratio", **job) <= 1
        assert value(got, "mixflow_constructor_last_step_imbalance_ratio", **job) >= 1
        for source in ("code", "docstrings", "topics"):
            labels = {"source": source, **job}
            written = [v for (r, s), v in ranks.items() if s == source]
            samples, tokens = sum(n for n, _ in written), sum(t for _, t in written)
            assert value(got, "mixflow_constructor_samples_total", **labels) == samples
            assert value(got, "mixflow_constructor_tokens_total", **labels) == tokens
            consumed = value(got, "mixflow_constructor_consumed_tokens_total", **labels)
            backlog = value(got, "mixflow_constructor_backlog_tokens", **labels)
            in_topic = _source_totals(kafka_bootstrap, topics, source)[1]
            assert tokens <= consumed <= in_topic
            # Approximate by design (unread records at the mean length; transaction markers count as records).
            assert abs(backlog - (in_topic - tokens)) <= 0.1 * in_topic + 1024, (source, backlog, in_topic, tokens)
        assert value(got, "mixflow_constructor_backlog_tokens", source="topics", **job) == 0

        # Sink: rank 0's micro-batches, served on its own port.
        dataset = KafkaBatchDataset(
            job=unique_name, bootstrap_servers=kafka_bootstrap, rank=0, metrics_port=ports["sink"]
        )
        iterator = iter(dataset)
        handed = [next(iterator) for _ in range(STALL_AT * 2)]
        try:
            got = scrape(urls["sink"])
        finally:
            iterator.close()
            dataset.metrics.close()
        labels = {"rank": "0", **job}
        rank0_tokens = sum(t for (r, _), (_, t) in ranks.items() if r == 0)
        assert sum(int(mb["cu_seqlens"][-1]) for mb in handed) == rank0_tokens
        assert value(got, "mixflow_sink_micro_batches_total", **labels) == STALL_AT * 2
        assert value(got, "mixflow_sink_tokens_total", **labels) == rank0_tokens
        assert value(got, "mixflow_sink_step", **labels) == STALL_AT - 1
        assert value(got, "mixflow_sink_wait_seconds_count", **labels) == STALL_AT * 2
        assert value(got, "mixflow_sink_prefetch_bytes", **labels) >= 0


def test_run_lists_every_role_and_serves_its_restarts(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    data = build_example_data(tmp_path / "data", limit=4)
    spec = write_spec(
        tmp_path,
        unique_name,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        step={"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 512},
    )
    roles = 3 + 1 + 1  # a loader per source, the constructor, the supervisor
    base = free_port_block(roles)
    state = tmp_path / "state"
    command = [sys.executable, "-m", "pipeline.cli", "run", "--spec", str(spec), "--job", unique_name]
    command += ["--state-dir", str(state), "--metrics-port-base", str(base)]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listing = state / "jobs" / unique_name / "metrics.json"
    supervisor = f"http://127.0.0.1:{base}/metrics"
    scraped: dict = {}

    def scraped_while_running() -> bool:
        nonlocal scraped
        if run.poll() is not None:
            return True
        with contextlib.suppress(urllib.error.URLError, OSError):
            scraped = scrape(supervisor)
        return sum(name == "mixflow_run_role_restarts_total" for name, _ in scraped) == roles - 1

    wait_until("the supervisor's endpoint listing every role", scraped_while_running, timeout_s=60)
    output, _ = run.communicate(timeout=240)
    assert run.returncode == 0, output[-3000:]
    assert scraped, f"the run ended before its supervisor endpoint listed its roles:\n{output[-3000:]}"
    listed = json.loads(listing.read_text())
    assert listed["job"] == unique_name
    entries = listed["roles"]
    urls = [e["url"] for e in entries]
    assert sorted(urls) == [f"http://127.0.0.1:{p}/metrics" for p in range(base, base + roles)]
    assert {(e["role"], e["source"]) for e in entries} == {
        ("supervisor", None),
        ("constructor", None),
        *(("loader", s) for s in ("code", "docstrings", "topics")),
    }
    for entry in entries:
        if entry["role"] != "supervisor":
            assert (state / "jobs" / unique_name / f"{entry['name']}.log").exists(), entry
            name = entry["name"]
            assert value(scraped, "mixflow_run_role_restarts_total", job=unique_name, role=name) == 0
