"""Loader autoscaling: the policy's properties, the autoscaler on a simulated job (curriculum look-ahead,
no flapping), the spec's fields, and on the real broker a job whose expensive source gets more loaders while
every sample still reaches the ranks exactly once."""

from __future__ import annotations

import contextlib
import itertools
import math
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.planning.step.state import ConstructorState
from pipeline.roles.autoscale import (
    Autoscaler,
    JobSnapshot,
    PolicySettings,
    PolicyState,
    SmoothedRate,
    SourceReading,
    SourceSnapshot,
    decide,
    horizon_shares,
)
from pipeline.roles.autoscale.autoscaler import LOADER_START_S
from pipeline.roles.autoscale.stalls import SourceLog, count_stalls, file_times
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import SpecError, load_spec
from tests.autoscale_support import REPO, SOURCES, build_job_data, decisions, job_folder, run_job, write_job_spec
from tests.loader_support import committed_sample_ids, expected_sample_ids
from tests.ports import free_port
from topics.formats.names import JobTopics
from topics.kafka.admin import ensure_job_topics

BOUNDS = {"min": 1, "max": 6}
SETTINGS = PolicySettings(headroom=1.2, low_watermark_s=10, high_watermark_s=60, scale_down_after_s=30)


def reading(name: str = "a", **fields: object) -> SourceReading:
    base: dict = {
        "source": name,
        "loaders": 2,
        "min_loaders": 1,
        "max_loaders": 8,
        "demand": 1000.0,
        "per_loader_rate": 500.0,
        "backlog_tokens": 0.0,
    }
    return SourceReading(**{**base, **fields})


readings_st = st.builds(
    reading,
    loaders=st.integers(1, 8),
    min_loaders=st.integers(1, 3),
    max_loaders=st.integers(3, 10),
    demand=st.none() | st.floats(0, 1e6),
    per_loader_rate=st.none() | st.floats(0, 1e5),
    backlog_tokens=st.floats(0, 1e8),
    units_left=st.none() | st.integers(0, 20),
)


@given(r=readings_st, above=st.none() | st.floats(0, 100), now=st.floats(0, 200))
def test_the_desired_count_is_always_within_the_sources_bounds(r: SourceReading, above: float | None, now: float):
    state = PolicyState({} if above is None else {r.source: above})
    [d], _ = decide([r], SETTINGS, state, now)
    assert r.min_loaders <= d.desired <= r.max_loaders, d


@given(
    r=readings_st,
    demands=st.tuples(st.floats(0, 1e6), st.floats(0, 1e6)),
    above=st.none() | st.floats(0, 100),
    now=st.floats(0, 200),
)
def test_more_demand_never_asks_for_fewer_loaders(r, demands, above, now):
    state = PolicyState({} if above is None else {r.source: above})
    low, high = sorted(demands)
    [d_low], _ = decide([SourceReading(**{**r.__dict__, "demand": low})], SETTINGS, state, now)
    [d_high], _ = decide([SourceReading(**{**r.__dict__, "demand": high})], SETTINGS, state, now)
    assert d_low.desired <= d_high.desired, (d_low, d_high)


@given(demand=st.floats(1, 1e6), rate=st.floats(1, 1e5), loaders=st.integers(1, 8))
def test_a_thin_backlog_scales_up_to_the_fewest_loaders_covering_demand_with_headroom(demand, rate, loaders):
    [d], _ = decide(
        [reading(loaders=loaders, demand=demand, per_loader_rate=rate, max_loaders=64)], SETTINGS, PolicyState(), 0
    )
    want = max(loaders, min(64, math.ceil(demand * 1.2 / rate - 1e-9)))
    assert d.desired == want
    if loaders < d.desired < 64:
        assert (d.desired - 1) * rate < demand * 1.2 <= d.desired * rate * (1 + 1e-9)


def test_scaling_down_waits_for_the_backlog_to_stay_above_the_high_watermark():
    flush = reading(loaders=4, demand=100.0, per_loader_rate=500.0, backlog_tokens=100.0 * 61)
    state = PolicyState()
    for now in (0.0, 10.0, 29.0):
        [d], state = decide([flush], SETTINGS, state, now)
        assert d.desired == 4 and "holding" in d.reason
    [d], state = decide([flush], SETTINGS, state, 30.0)
    assert d.desired == 1 and "scaling down" in d.reason
    # A dip below the high watermark starts the wait again.
    [d], state = decide([reading(loaders=4, demand=100.0, backlog_tokens=100.0 * 59)], SETTINGS, PolicyState(), 0)
    assert d.desired == 4 and state.high_since == {}


def test_a_backlog_between_the_watermarks_holds_the_count():
    [d], _ = decide([reading(loaders=2, demand=5000.0, backlog_tokens=5000.0 * 20)], SETTINGS, PolicyState(), 0)
    assert d.desired == 2 and "low watermark" in d.reason


def test_nothing_changes_before_rates_are_measured_or_when_no_unit_is_left():
    for r in (reading(demand=None), reading(per_loader_rate=None), reading(demand=1e6, units_left=0)):
        [d], _ = decide([r], SETTINGS, PolicyState(), 0)
        assert d.desired == r.loaders, d
    [d], _ = decide([reading(loaders=1, demand=1e6, units_left=2)], SETTINGS, PolicyState(), 0)
    assert d.desired == 3  # never more loaders than units left to take


@given(
    demands=st.lists(st.floats(0, 1e5), min_size=2, max_size=5),
    rates=st.lists(st.floats(10, 1e4), min_size=5, max_size=5),
    budget=st.integers(5, 20),
)
def test_the_budget_goes_to_the_worst_covered_sources_first(demands, rates, budget):
    rs = [reading(str(i), loaders=1, demand=d, per_loader_rate=rates[i], max_loaders=8) for i, d in enumerate(demands)]
    decisions, _ = decide(rs, PolicySettings(max_total_loaders=budget), PolicyState(), 0)
    unlimited, _ = decide(rs, PolicySettings(), PolicyState(), 0)
    assert sum(d.desired for d in decisions) <= budget
    assert all(1 <= d.desired <= u.desired for d, u in zip(decisions, unlimited, strict=True))
    if sum(u.desired for u in unlimited) > budget:
        assert sum(d.desired for d in decisions) == budget
        cut = [d for d, u in zip(decisions, unlimited, strict=True) if d.desired < u.desired]
        cover = {d.source: d.desired * rates[int(d.source)] / (d.demand * 1.2) for d in decisions if d.demand > 0}
        for d in cut:
            # A cut source is covered at most as well as any source that got a loader beyond its min,
            # judged before that source's last loader.
            for other in decisions:
                if other.desired > 1 and other.demand > 0 and other.source != d.source:
                    before = (other.desired - 1) * rates[int(other.source)] / (other.demand * 1.2)
                    assert before <= cover[d.source] + 1e-9, (d, other)


def test_horizon_shares_take_the_largest_share_up_to_the_horizon():
    shares = {0: {"a": 0.9, "b": 0.1}, 100: {"a": 0.4, "b": 0.6}}

    def at(step: int) -> dict[str, float]:
        return shares[100 if step >= 100 else 0]

    assert horizon_shares(at, 0, 50, [0, 100]) == {"a": 0.9, "b": 0.1}
    assert horizon_shares(at, 60, 40, [0, 100]) == {"a": 0.9, "b": 0.6}
    assert horizon_shares(at, 120, 1000, [0, 100]) == {"a": 0.4, "b": 0.6}


def test_smoothed_rate_skips_intervals_it_is_told_not_to_measure():
    rate = SmoothedRate(0.5)
    assert rate.update(0, 0) is None
    assert rate.update(1, 100) == 100
    assert rate.update(2, 100, measure=False) == 100  # idle: not a rate of 0
    assert rate.update(3, 400, per=2) == 125  # 300/s over 2 loaders = 150; halfway from 100


# -- the autoscaler on a simulated job -------------------------------------------------------------


def write_spec(folder: Path, *, mixture: dict, scaling: dict, sources: dict[str, dict]) -> Path:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    spec = {
        "job": "sim",
        "sources": [
            {"name": name, "reader": "jsonl", "path": "data", "pretokenized": True, **fields}
            for name, fields in sources.items()
        ],
        "mixture": mixture,
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1000},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "composition": None,  # draws in order: a step waits for one step of each source, as SimulatedJob
        "autoscaling": {"enabled": True, **scaling},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


START_S = 5.0  # a loader makes nothing for this long after it is started
WARM_UP_S = 10.0  # the first loaders start


class SimulatedJob:
    """Loaders making tokens at ``rate`` each (each from START_S after it started), a constructor wanting
    ``steps_per_second`` steps of 4000 tokens in the mixture's shares, waiting for any source whose backlog
    cannot fill its share of the next step; tokens per offset are 1."""

    def __init__(self, autoscaler: Autoscaler, rates: dict[str, float], steps_per_second: float, rng) -> None:
        self.scaler = autoscaler
        self.rates = rates
        self.speed = steps_per_second
        self.rng = rng
        self.made = dict.fromkeys(rates, 0.0)
        self.used = dict.fromkeys(rates, 0.0)
        self.loaders = {s: [0.0] * autoscaler.spec.source(s).loaders for s in rates}  # start times
        self.step = 0.0
        self.lost_steps = 0.0  # steps the constructor could have made but waited instead, after warming up
        self.history: list[dict[str, int]] = []

    def run(self, seconds: float, dt: float = 0.25, interval: float = 2.0, noise: float = 0.1) -> None:
        mixer = self.scaler.mixer
        t = 0.0
        next_decision = interval
        while t < seconds:
            for s, starts in self.loaders.items():
                jitter = 1 + noise * self.rng.uniform(-1, 1)
                self.made[s] += sum(self.rates[s] * dt * jitter for began in starts if t - began >= START_S)
            shares = mixer.weights_at(int(self.step))
            want = {s: 4000 * self.speed * dt * shares[s] for s in self.rates}
            fraction = min([1.0] + [(self.made[s] - self.used[s]) / w for s, w in want.items() if w > 0])
            if t >= WARM_UP_S:
                self.lost_steps += (1.0 - max(fraction, 0.0)) * self.speed * dt
            for s, w in want.items():
                self.used[s] += w * max(fraction, 0.0)
            self.step += self.speed * dt * max(fraction, 0.0)
            t += dt
            if t >= next_decision:
                next_decision += interval
                self.decide(t)

    def decide(self, now: float) -> None:
        snapshot = JobSnapshot(
            int(self.step),
            (),
            {s: SourceSnapshot(int(self.made[s]), int(self.used[s]), 1.0, 100) for s in self.rates},
        )
        counts = {s: len(v) for s, v in self.loaders.items()}
        for d in self.scaler.observe(snapshot, counts, now):
            starts = self.loaders[d.source]
            while len(starts) < d.desired:
                starts.append(now)
            del starts[max(d.desired, 1) :]
        self.history.append({s: len(v) for s, v in self.loaders.items()})


def test_the_autoscaler_gives_an_expensive_source_more_loaders_and_does_not_flap(tmp_path: Path):
    spec = load_spec(
        write_spec(
            tmp_path,
            mixture={"weights": {"cheap": 1, "costly": 1}},
            scaling={"interval_s": 2, "low_watermark_s": 4, "high_watermark_s": 20, "scale_down_after_s": 10},
            sources={
                "cheap": {"loaders": 2, "autoscale": BOUNDS},
                "costly": {"loaders": 2, "autoscale": BOUNDS},
            },
        )
    )
    for seed in range(4):
        job = SimulatedJob(Autoscaler(spec), {"cheap": 4000.0, "costly": 400.0}, 1.0, np.random.default_rng(seed))
        job.run(240)
        late = job.history[len(job.history) // 2 :]
        assert late[-1]["costly"] >= 5 and late[-1]["cheap"] == 1, job.history
        changes = sum(a != b for a, b in itertools.pairwise(late))
        assert changes <= 2, late


def test_a_growing_share_gets_its_loaders_before_the_constructor_reaches_it(tmp_path: Path):
    # "late" goes from 5% to 80% of each step at step 40; the constructor runs 1 step/s. The backlog one loader
    # of "late" builds until then lasts less than starting a loader takes; without looking ahead the source
    # gets its loaders only once its backlog runs thin, and the constructor waits for them.
    curriculum = {
        "schedule": [
            {"step": 0, "weights": {"early": 19, "late": 1}},
            {"step": 40, "weights": {"early": 1, "late": 4}},
        ]
    }
    stalls = {}
    for lookahead in (0.0, 60.0):
        spec = load_spec(
            write_spec(
                tmp_path,
                mixture=curriculum,
                scaling={"interval_s": 2, "lookahead_s": lookahead, "low_watermark_s": 30, "high_watermark_s": 600},
                sources={
                    "early": {"loaders": 3, "autoscale": BOUNDS},
                    "late": {"loaders": 1, "autoscale": {"min": 1, "max": 10}},
                },
            )
        )
        job = SimulatedJob(Autoscaler(spec), {"early": 2000.0, "late": 400.0}, 1.0, np.random.default_rng(0))
        job.run(120, noise=0.0)
        stalls[lookahead] = job.lost_steps
        if lookahead:
            # ceil(0.8 x 4000 tokens/s x 1.2 headroom / 400 tokens/s per loader) = 10
            assert job.history[-1]["late"] == 10, job.history[-1]
    assert stalls[60.0] < 0.5 and stalls[0.0] > 2, stalls


# -- the spec --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sources": {"autoscale": {"min": 3, "max": 2}}}, "sources[0].autoscale.max"),
        ({"sources": {"loaders": 5, "autoscale": {"min": 1, "max": 4}}}, "sources[0].loaders"),
        ({"autoscaling": {"headroom": 0.5}}, "autoscaling.headroom"),
        ({"autoscaling": {"low_watermark_s": 30, "high_watermark_s": 20}}, "autoscaling.high_watermark_s"),
        ({"autoscaling": {"max_total_loaders": 1}}, "autoscaling.max_total_loaders"),
        ({"autoscaling": {"interval": 3}}, "autoscaling.interval"),
    ],
)
def test_a_bad_autoscaling_field_is_refused_by_name(tmp_path: Path, change: dict, field: str):
    path = write_spec(tmp_path, mixture={"weights": {"a": 1, "b": 1}}, scaling={}, sources={"a": {}, "b": {}})
    body = yaml.safe_load(path.read_text())
    body["sources"][0].update(change.get("sources", {}))
    body["autoscaling"].update(change.get("autoscaling", {}))
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert field in str(caught.value), str(caught.value)


def test_autoscaling_is_off_unless_asked_for(tmp_path: Path):
    path = write_spec(tmp_path, mixture={"weights": {"a": 1}}, scaling={}, sources={"a": {"loaders": 3}})
    body = yaml.safe_load(path.read_text())
    del body["autoscaling"]
    path.write_text(yaml.safe_dump(body))
    spec = load_spec(path)
    assert not spec.autoscaling.enabled
    assert spec.source("a").loader_bounds() == (3, 3)


@given(
    lengths=st.lists(st.integers(1, 50), min_size=5, max_size=60),
    produced_before=st.integers(0, 60),
    need=st.integers(1, 400),
)
def test_a_step_stalls_when_the_sample_completing_its_need_came_after_the_previous_step(lengths, produced_before, need):
    from pipeline.planning.mixing import MixerState
    from pipeline.planning.step.state import SourcePosition

    n = len(lengths)
    log = SourceLog(np.arange(n, dtype=np.int64), np.asarray(lengths), np.arange(n, dtype=np.int64) * 10)
    state = ConstructorState(MixerState.initial(("a",)), {"a": SourcePosition(0, ())})
    written_ms = produced_before * 10 - 5  # samples 0..produced_before-1 were there already
    count = count_stalls([(written_ms, state)], {"a": log}, lambda step: {"a": float(need)})
    completes = int(np.searchsorted(np.cumsum(lengths), need))  # the sample the need waits for
    expected = completes < n and completes >= produced_before
    assert (count.stalled, count.by_source["a"], count.steps) == (int(expected), int(expected), 1)


# -- on the real broker ----------------------------------------------------------------------------


@pytest.mark.kafka
def test_a_job_gives_its_expensive_source_more_loaders_and_delivers_every_sample_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
):
    """``code`` costs about 10x per token and starts with 1 loader, ``docs`` about 3x with 2, within
    a budget of 4: the autoscaler stops a ``docs`` loader (SIGTERM, a clean exit) and gives ``code`` a second
    one. Every sample reaches its source topic exactly once (against the ids its work units yield) and the
    rank topics at most once (the job stops when ``code`` runs out)."""
    data = build_job_data(tmp_path / "data", {"code": 60, "docs": 300, "notes": 100})
    scaling = {
        "interval_s": 1.0,
        "low_watermark_s": 5,
        "high_watermark_s": 10,
        "scale_down_after_s": 2,
        "lookahead_s": 10,
        "max_total_loaders": 4,
    }
    loaders = {"code": 1, "docs": 2, "notes": 1}
    bounds = {"code": (1, 3), "docs": (1, 2)}
    costs = {"code": "wait500", "docs": "wait150"}
    spec = write_job_spec(tmp_path, unique_name, kafka_bootstrap, data, loaders, scaling, bounds, costs=costs)
    state = tmp_path / "state"
    run = run_job(spec, state, timeout_s=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "each sample exactly once: yes" in run.stdout, run.stdout
    assert "roles restarted after dying: none" in run.stdout, run.stdout
    made = decisions(state)
    peak = {s: max(d["running"] for d in made if d["source"] == s) for s in loaders}
    assert peak["code"] == 2, made  # the budget's 4 less the others' min of 1 each
    stopped = [d for d in made if d["source"] == "docs" and d["desired"] < d["loaders"]]
    # Stopped because its backlog stayed high, or because the budget went to code, covered worse.
    assert stopped and ("scaling down" in stopped[0]["reason"] or "budget" in stopped[0]["reason"]), made
    assert "load-docs-1 stopped by the autoscaler (exit 0)" in run.stderr, run.stderr[-5000:]
    code_logs = sorted(p.name for p in job_folder(state).glob("load-code-*.log"))
    assert code_logs[:2] == ["load-code-0.log", "load-code-1.log"], code_logs
    job = load_spec(spec)
    for source in SOURCES:
        committed = Counter(committed_sample_ids(kafka_bootstrap, JobTopics(unique_name), source))
        assert committed == expected_sample_ids(job, kafka_bootstrap, source), source


@pytest.mark.kafka
def test_mixflow_autoscale_exports_the_desired_loaders_of_a_job(kafka_bootstrap: str, unique_name: str, tmp_path: Path):
    """Against a job whose topics exist but that nothing runs yet: no loader is in any group and nothing is
    measured, so each source is wanted at its min, and the gauges say so; SIGTERM ends it cleanly."""
    data = build_job_data(tmp_path / "data", {"code": 2, "docs": 2, "notes": 2})
    loaders = {"code": 2, "docs": 1, "notes": 1}
    spec = write_job_spec(tmp_path, unique_name, kafka_bootstrap, data, loaders, {"interval_s": 0.5}, {"code": (2, 3)})
    ensure_job_topics({"bootstrap.servers": kafka_bootstrap}, unique_name, list(SOURCES), 2)
    port = free_port()
    command = [sys.executable, "-m", "pipeline.cli", "autoscale", "--spec", str(spec), "--metrics-port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        labels = f'job="{unique_name}",source="code"'
        text = wait_for_metric(port, f"mixflow_autoscaler_desired_loaders{{{labels}}} 2.0", process, timeout_s=60)
        for gauge in ("loaders", "demand_tokens_per_second", "supply_tokens_per_second"):
            assert f"mixflow_autoscaler_{gauge}{{{labels}}} 0.0" in text, text
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "code: 0 -> 2 loaders" in stderr and "not measured yet" in stderr, stderr


def wait_for_metric(port: int, line: str, process: subprocess.Popen, timeout_s: float) -> str:
    """The metrics page once it holds ``line``; fails when the process exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            msg = f"mixflow autoscale exited with {process.returncode}: {process.stderr.read()}"  # type: ignore[union-attr]
            raise AssertionError(msg)
        with contextlib.suppress(OSError):
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            if line in text:
                return text
        time.sleep(0.2)  # polling an HTTP endpoint: nothing to wait on
    msg = f"no {line!r} on port {port} after {timeout_s} s; last page:\n{text}"
    raise AssertionError(msg)


def test_a_samples_time_is_the_latest_of_its_files_samples_per_epoch():
    ids = ["s/a.txt/0", "s/a.txt/1#1", "s/b.txt/0", "s/a.txt/0@e1", "s/a.txt/1@e1", "s/dir/a.txt/0"]
    times = file_times(ids, np.array([1, 5, 3, 9, 7, 2]))
    assert times.tolist() == [5, 5, 3, 9, 9, 2]


def test_a_source_the_constructor_waits_for_gets_one_more_loader_each_decision_even_before_the_first_step():
    for demand in (None, 10.0):
        r = reading(loaders=2, demand=demand, per_loader_rate=500.0, blocking=True)
        [d], _ = decide([r], SETTINGS, PolicyState(), 0)
        assert d.desired == 3 and "scaling up" in d.reason, d  # ceil(2 x 500 x 1.2 / 500)


@given(loaders=st.integers(1, 8), max_loaders=st.integers(1, 8), units_left=st.one_of(st.none(), st.integers(0, 12)))
def test_a_starving_source_gets_one_more_loader_per_decision_before_its_rate_is_measured(
    loaders: int, max_loaders: int, units_left: int | None
):
    loaders = min(loaders, max_loaders)
    for demand in (None, 1000.0):
        r = reading(
            loaders=loaders,
            max_loaders=max_loaders,
            demand=demand,
            per_loader_rate=None,
            blocking=True,
            units_left=units_left,
        )
        [d], _ = decide([r], SETTINGS, PolicyState(), 0)
        room = units_left is None or units_left > loaders
        assert d.desired == (min(loaders + 1, max_loaders) if room else loaders), d
    # Not starving: it holds until measured (the warm-up rule never scales down or moves a fed source).
    [d], _ = decide(
        [reading(loaders=loaders, max_loaders=max_loaders, per_loader_rate=None)], SETTINGS, PolicyState(), 0
    )
    assert d.desired == loaders


def test_a_source_with_nothing_yet_while_others_have_samples_gets_loaders_one_start_up_apart(tmp_path: Path):
    spec = load_spec(
        write_spec(
            tmp_path,
            mixture={"weights": {"cheap": 1, "costly": 1}},
            scaling={"interval_s": 1},
            sources={"cheap": {"loaders": 2, "autoscale": BOUNDS}, "costly": {"loaders": 1, "autoscale": BOUNDS}},
        )
    )
    scaler = Autoscaler(spec)
    empty = {s: SourceSnapshot(0, 0, None, None) for s in ("cheap", "costly")}
    decided = scaler.observe(JobSnapshot(None, (), empty), {"cheap": 2, "costly": 1}, 0.0)
    assert [d.desired for d in decided] == [2, 1], decided  # nothing made anywhere yet: no one starves
    fed = {"cheap": SourceSnapshot(5000, 0, 1.0, 100), "costly": SourceSnapshot(0, 0, None, 100)}
    counts = {"cheap": 2, "costly": 1}
    raised = []
    for now in np.arange(1.0, 30.0, 1.0).tolist():
        decided = {d.source: d for d in scaler.observe(JobSnapshot(None, (), fed), counts, now)}
        assert decided["cheap"].desired == 2, decided  # fed, not measured: held
        if decided["costly"].desired > counts["costly"]:
            raised.append(now)
        counts["costly"] = decided["costly"].desired
    # One more each time the last one had LOADER_START_S to start, from the first decision that may, up to max.
    assert counts["costly"] == BOUNDS["max"] and raised[0] == LOADER_START_S, raised
    assert all(b - a >= LOADER_START_S for a, b in itertools.pairwise(raised)), raised


def test_the_planner_measures_its_cost_on_a_few_kib_only_when_the_job_autoscales(tmp_path: Path):
    spec_path = write_spec(tmp_path, mixture={"weights": {"a": 1}}, scaling={}, sources={"a": {"loaders": 1}})
    (tmp_path / "data" / "part.jsonl").write_text("".join(f'{{"text": [{i}, 1, 2]}}\n' for i in range(50)))
    body = yaml.safe_load(spec_path.read_text())
    for enabled in (True, False):
        body["autoscaling"]["enabled"] = enabled
        spec_path.write_text(yaml.safe_dump(body))
        runtime = SourceRuntime.from_spec(load_spec(spec_path), "a")
        assert runtime.quick_cost is enabled
        assert runtime.measure_cost() > 0
