"""The example job's steps replayed offline: per-step balance and fill, and the stretches of poor steps.

    .venv/bin/python -m benchmarks.example_stretches_bench --dump JOB --data lengths.npz  # needs the broker
    .venv/bin/python -m benchmarks.example_stretches_bench --data lengths.npz [--pack-ahead 0,1] [--markdown]

``--dump`` reads the source topics of a run of ``examples/example.yaml`` (``mixflow run --spec
examples/example.yaml --job JOB``, no trainer) and writes every source's sample lengths in offset order.
Without it, the steps are made again from those lengths by the constructor's step core (``StepCore``:
``compose_step`` then ``plan_step``, the deferred samples first, a source exhausted once its draw waits
for it with everything read, then the final steps), as the constructor makes them once the loaders are
done: composition is a function of the windows, not of what is buffered beyond them, so these are the
run's steps. Each value of ``--pack-ahead`` (``_composition.options.PACK_AHEAD``: micro-batches of tokens a
packed option may take from a source beyond its target) gets a row:

steps; the median, mean and 95th percentile over steps of max/mean rank cost; fill (tokens over
capacity); the step time, the sum over steps of the largest rank cost, over the first row's; the
steps in stretches (where the 25-step rolling median of max/mean, as ``mixflow report`` draws it, is
above 1.1) and how many stretches; the largest cumulative drift from the schedule of any source, in
tokens, over the steps before a source ran out (as ``mixflow report`` gives it); and the seconds the
replay took.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing import DrawStatus, Mixer, Schedule
from pipeline.planning.mixing._composition import options
from pipeline.planning.shape import StepShape
from pipeline.planning.step.core import PlannedStep, StepCore, StepWindow
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.observe.series import rolling_median
from pipeline.tools.observe.step_stats import schedule_drift

SPEC = Path(__file__).resolve().parent.parent / "examples" / "example.yaml"
STRETCH_ABOVE = 1.1
MEDIAN_STEPS = 25


def dump(job: str, spec: JobSpec, out: Path) -> None:
    from topics.formats.names import JobTopics
    from topics.formats.sample_codec import decode_sample_message
    from topics.kafka.log_reader import read_to_end

    config = {"bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")}
    lengths = {}
    for s in spec.source_names:
        records = read_to_end(config, JobTopics(job).src(s), timeout_s=120)
        lengths[s] = np.array([decode_sample_message(m).length for m in records], np.int64)
        print(f"{s}: {len(lengths[s])} samples, {int(lengths[s].sum())} tokens")
    np.savez(out, **lengths)


@dataclass
class Steps:
    """Per step: each rank's cost, the tokens placed per source, and how many sources had run out."""

    rank_costs: list[np.ndarray]
    tokens: list[np.ndarray]
    exhausted: list[int]


def replay(spec: JobSpec, lengths: dict[str, np.ndarray]) -> Steps:
    mixer = Mixer.from_spec(spec)
    cost_model = spec.cost.cost_model()
    core = StepCore(StepShape.from_spec(spec.step), cost_model)
    names = list(lengths)
    fifo = {s: np.arange(len(lengths[s])) for s in names}
    deferred: list[tuple[int, int]] = []  # (source index, sample index), in priority order
    state, exhausted, final = mixer.initial_state(), set[str](), False
    out = Steps([], [], [])
    while True:
        source = np.array([k for k, _ in deferred], np.int64)
        held = np.array([lengths[names[k]][i] for k, i in deferred], np.int64)
        window = StepWindow({s: lengths[s][fifo[s]] for s in names}, source, held)
        planned: PlannedStep | None
        if final:
            if not deferred and all(len(f) == 0 for f in fifo.values()):
                return out
            planned = core.final_step(state, window)
        else:
            outcome = core.next_step(mixer, state, window, exhausted)
            if outcome.status is DrawStatus.WAITING:  # everything is read: a source waited for has run out
                exhausted |= set(outcome.waiting_for)
                continue
            final = outcome.status is DrawStatus.STOP
            planned = outcome.planned
            if planned is None:
                continue
        numbered = deferred + [(k, int(fifo[s][p])) for k, s in enumerate(names) for p in planned.taken[s]]
        candidates = [numbered[i] for i in planned.order.tolist()]
        placed = planned.plan.placed_mask
        of = np.array([k for k, _ in candidates], np.int64)
        out.rank_costs.append(planned.llm_rank_costs(cost_model))
        out.tokens.append(np.bincount(of[placed], weights=planned.lengths[placed], minlength=len(names)))
        out.exhausted.append(len(exhausted))
        deferred = [c for c, p in zip(candidates, placed.tolist(), strict=True) if not p]
        for s in names:
            fifo[s] = np.delete(fifo[s], planned.taken[s])
        state = planned.next_state


def stretches(ratios: np.ndarray) -> list[tuple[int, int]]:
    """The runs of steps [first, end) where the rolling median of max/mean is above ``STRETCH_ABOVE``."""
    above = np.concatenate([[False], rolling_median(ratios, MEDIAN_STEPS) > STRETCH_ABOVE, [False]])
    edges = np.flatnonzero(np.diff(above.astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


HEADERS = (
    "pack ahead",
    "steps",
    "max/mean median",
    "mean",
    "p95",
    "fill",
    "step time",
    "steps in stretches",
    "drift (tokens)",
)


def summary(spec: JobSpec, steps: Steps) -> dict[str, object]:
    """The row's numbers (see the module docstring), the step time unscaled."""
    costs = np.array(steps.rank_costs)
    ratios = costs.max(axis=1) / costs.mean(axis=1)
    tokens = np.array(steps.tokens)
    full = next((k for k, n in enumerate(steps.exhausted) if n), len(steps.exhausted))
    weights = Schedule.from_spec(spec.mixture, spec.source_names).weights_array(np.arange(full))
    drift = schedule_drift(tokens[:full], weights)
    runs = stretches(ratios)
    return {
        "steps": len(ratios),
        "max/mean median": f"{np.median(ratios):.4f}",
        "mean": f"{ratios.mean():.4f}",
        "p95": f"{np.percentile(ratios, 95):.3f}",
        "fill": f"{(tokens.sum(axis=1) / spec.step.tokens_per_step).mean():.4f}",
        "step time": float(costs.max(axis=1).sum()),
        "steps in stretches": f"{sum(b - a for a, b in runs)} in {len(runs)}",
        "drift (tokens)": ", ".join(f"{s} {d:.0f}" for s, d in zip(spec.source_names, drift, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=SPEC)
    parser.add_argument("--data", type=Path, required=True, help="the sources' sample lengths (.npz)")
    parser.add_argument("--dump", metavar="JOB", help="write --data from this job's source topics, and stop")
    parser.add_argument("--pack-ahead", default=f"0,{options.PACK_AHEAD:g}", help="values to compare")
    add_markdown_flag(parser)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    if args.dump:
        dump(args.dump, spec, args.data)
        return
    stored = np.load(args.data)
    lengths = {s: stored[s] for s in spec.source_names}
    shipped, results = options.PACK_AHEAD, []
    try:
        for ahead in (float(v) for v in args.pack_ahead.split(",")):
            options.PACK_AHEAD = ahead
            results.append({"pack ahead": f"{ahead:g}", **summary(spec, replay(spec, lengths))})
    finally:
        options.PACK_AHEAD = shipped
    reference = float(results[0]["step time"])  # type: ignore[arg-type]
    for result in results:
        result["step time"] = f"{float(result['step time']) / reference:.4f}"  # type: ignore[arg-type]
    print_table(HEADERS, [[r[h] for h in HEADERS] for r in results], markdown=args.markdown)


if __name__ == "__main__":
    main()
