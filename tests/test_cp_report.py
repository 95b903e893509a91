"""The observing tools on a real context-parallel job (aligned, 4 ranks, a few long samples among short ones): the
report `mixflow run` prints at its end, `mixflow report` and `mixflow top --once` give each step's block sizes and
each rank's micro-batches as the rank topics hold them, and its step time against the lower bound and against
static CP sized for the step's longest sample, as the planner scores the same samples; a spec without
step.context_parallel is refused on such a job in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.planning.scheduler.context_parallel import CPMode, CPShape, lower_bound, plan_cp_step, static_shape
from pipeline.spec import load_spec
from tests.kafka_support import read_to_end
from tests.loader_support import REPO, build_example_data, write_spec
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.names import JobTopics

RANKS, MICRO_BATCHES, CAPACITY, LONGEST = 4, 4, 128, 512


def mixflow(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == code, f"mixflow {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def _steps(bootstrap: str, job: str) -> list[list[CPBatch]]:
    """Per step, every rank's batch, from the rank topics."""
    per_rank = []
    for r in range(RANKS):
        records = read_to_end(bootstrap, JobTopics(job).rank(r))
        batches = [decode_any_batch_message(m) for m in records if end_of_data_steps(m.headers()) is None]
        assert all(isinstance(b, CPBatch) for b in batches)
        per_rank.append(sorted(batches, key=lambda b: b.step))
    return [list(step) for step in zip(*per_rank, strict=True)]


def _blocks(step: list[CPBatch]) -> list[tuple[int, int, int]]:
    """(block size, samples, tokens) of a step, each sample counted on the first rank of its block."""
    samples: Counter[int] = Counter()
    tokens: Counter[int] = Counter()
    for batch in step:
        for size, rank_in, length in zip(
            batch.cp_size.tolist(), batch.cp_rank.tolist(), batch.lengths.tolist(), strict=True
        ):
            if rank_in == 0:
                samples[size] += 1
                tokens[size] += length
    return [(c, samples[c], tokens[c]) for c in sorted(samples)]


@pytest.fixture(scope="module")
def job(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, subprocess.CompletedProcess]:
    """A context-parallel job run to its end by `mixflow run`: its spec, name and what the run printed."""
    folder = tmp_path_factory.mktemp("cp-report")
    data = build_example_data(folder / "data", limit=4)
    name = f"cpr{np.random.default_rng().integers(16**8):08x}"
    spec = write_spec(
        folder,
        name,
        kafka_bootstrap,
        data,
        on_exhausted="renormalize",
        step={
            "ranks": RANKS,
            "micro_batches": MICRO_BATCHES,
            "tokens_per_micro_batch": CAPACITY,
            "context_parallel": {"mode": "aligned", "size": RANKS},
        },
    )
    spec.write_text(spec.read_text().replace("max_sample_length: 512", f"max_sample_length: {LONGEST}"))
    run = mixflow("run", "--spec", str(spec), "--state-dir", str(folder / "state"))
    return spec, name, run


@pytest.mark.kafka
def test_the_run_report_counts_each_sample_once_and_states_the_blocks(
    kafka_bootstrap: str, job: tuple[Path, str, subprocess.CompletedProcess]
) -> None:
    _, name, run = job
    steps = _steps(kafka_bootstrap, name)
    lines = run.stdout.splitlines()
    assert "each sample exactly once: yes" in lines, run.stdout
    assert any(line.startswith("every committed source sample reached a rank topic: yes") for line in lines)
    totals: Counter[int] = Counter()
    for step in steps:
        for c, n, _ in _blocks(step):
            totals[c] += n
    assert len(totals) > 1 and 1 in totals, f"short samples whole and long ones on blocks: {totals}"
    expected = ", ".join(f"{c}: {n:,} (" for c, n in sorted(totals.items()))
    blocks = next(line for line in lines if line.startswith("samples (tokens) by block size: "))
    assert re.sub(r"\([0-9,]+\)", "(", blocks.split(": ", 1)[1]) == expected, blocks
    assert "context parallelism: aligned, blocks of up to 4 ranks" in lines
    micro = [b.micro_batches for step in steps for b in step]
    assert f"micro-batches a rank a step, least-most (median): {min(micro)}-{max(micro)} (" in run.stdout
    assert re.search(
        r"^step time under the cost model over the lower bound, median \(worst\): [0-9.]+x", run.stdout, re.M
    )
    assert "static CP sized for each step's longest sample: blocks of " in run.stdout
    assert "naive" not in run.stdout, "no naive per-rank loading for a job whose samples span ranks"


@pytest.mark.kafka
def test_report_and_top_give_each_steps_blocks_micro_batches_and_times(
    kafka_bootstrap: str, job: tuple[Path, str, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    spec_path, name, _ = job
    spec = load_spec(spec_path)
    cost = spec.cost.context_parallel_cost()
    steps = _steps(kafka_bootstrap, name)
    out = tmp_path / "report"
    mixflow("report", "--spec", str(spec_path), "--out", str(out))
    summary = (out / "report.md").read_text()
    assert (out / "context-parallel.png").read_bytes()[:4] == b"\x89PNG" and "](context-parallel.png)" in summary
    table = summary.split("## Context parallelism by step\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(table) == len(steps)
    for row, step in zip(table, steps, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0] == str(step[0].step)
        assert cells[1] == ", ".join(f"{c}: {n:,} ({t:,})" for c, n, t in _blocks(step)), row
        assert cells[2] == " ".join(str(b.micro_batches) for b in step), row
    frame = json.loads(mixflow("top", "--spec", str(spec_path), "--once", "--json").stdout)
    shown = frame["context_parallel"]
    assert frame["constructor"]["naive_imbalance_median"] is None and shown
    by_step = {b[0].step: b for b in steps}
    shape = CPShape(RANKS, MICRO_BATCHES, CAPACITY, CPMode.ALIGNED, RANKS)
    for row in shown:
        step = by_step[row["step"]]
        assert [tuple(b) for b in row["blocks"]] == _blocks(step)
        assert row["micro_batches"] == [b.micro_batches for b in step]
        lengths = np.array(
            [n for b in step for n, k in zip(b.lengths.tolist(), b.cp_rank.tolist(), strict=True) if k == 0]
        )
        assert row["bound_s"] == pytest.approx(lower_bound(lengths, shape, cost))
        assert row["step_s"] >= row["bound_s"] * (1 - 1e-9) and row["over_bound"] >= 1 - 1e-9
        static = static_shape(lengths, RANKS, MICRO_BATCHES, CAPACITY)
        static_plan = plan_cp_step(lengths, static, cost)
        assert row["static_size"] == static.size
        assert row["static_s"] == pytest.approx(static_plan.step_time(lengths, cost))
        assert row["static_deferred"] == int((~static_plan.placed_mask).sum())
    text = mixflow("top", "--spec", str(spec_path), "--once").stdout
    assert f"context parallelism: the last {min(8, len(shown))} steps" in text, text
    for row in shown[-8:]:
        cells = ", ".join(f"{c}: {n:,} ({t:,})" for c, n, t in row["blocks"])
        micro = " ".join(map(str, row["micro_batches"]))
        assert re.search(rf"│\s+{row['step']} │ {re.escape(cells)}\s+│ {micro}\s+│", text), text


@pytest.mark.kafka
def test_a_spec_without_context_parallelism_is_refused_on_the_job(
    job: tuple[Path, str, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    spec_path, _name, _ = job
    text = spec_path.read_text()
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        re.sub(r"  context_parallel:\n(    .*\n)+", "", text).replace(
            f"max_sample_length: {LONGEST}", "max_sample_length: 128"
        )
    )
    assert "context_parallel" not in plain.read_text()
    for command in (["report", "--out", str(tmp_path / "r")], ["top", "--once"]):
        result = mixflow(command[0], "--spec", str(plain), *command[1:], code=2)
        assert result.stderr.count("\n") == 1, result.stderr
        assert "holds a context-parallel batch (format version 2 or 3) but the spec has no step.context_parallel" in (
            result.stderr
        ), result.stderr


@pytest.mark.kafka
def test_the_chaos_audit_puts_each_sample_back_together_and_checks_a_sinks_record(
    kafka_bootstrap: str, job: tuple[Path, str, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    from pipeline.tools.chaos.audit import check_samples, check_sink_record, read_rank_topic
    from pipeline.tools.chaos.sink import run_sink
    from pipeline.tools.delivery import RECEIVED_FILE, expected_samples

    spec_path, name, _ = job
    spec = load_spec(spec_path)
    config = spec.kafka.client_config(kafka_bootstrap)
    problems: list[str] = []
    per_rank = [read_rank_topic(config, name, r, spec.step, problems) for r in range(RANKS)]
    expected: dict[str, str] = {}
    for source in spec.source_names:
        expected.update(expected_samples(spec, config, source))
    delivered = check_samples(per_rank, expected, problems)
    assert not problems and delivered.keys() == expected.keys() and set(delivered.values()) == {1}
    # A sink's record of rank 2, as the chaos run's sink writes it, equals the rank's micro-batches.
    steps = run_sink(spec_path, 2, tmp_path, kafka_bootstrap, wait_timeout_s=60)
    assert steps == len(per_rank[2])
    lines = check_sink_record(tmp_path / RECEIVED_FILE.format(rank=2), per_rank[2], problems)
    assert not problems and lines == sum(max(1, b.micro_batches) for b in per_rank[2])
    # A rank's batch lost: the samples of its blocks no longer come back whole.
    at = next(k for k, b in enumerate(per_rank[3]) if (b.cp_size > 1).any())
    split = {i for i, c in zip(per_rank[3][at].sample_ids, per_rank[3][at].cp_size.tolist(), strict=True) if c > 1}
    broken = [list(batches) for batches in per_rank]
    del broken[3][at]
    check_samples(broken, expected, problems)
    assert f"{len(split)} context-parallel samples whose block's slices do not make the sample" in problems[0]
