"""Autoscaling benchmark: the same heterogeneous job with a fixed allocation of loaders and with autoscaling
under the same total budget, side by side.

    .venv/bin/python -m benchmarks.autoscale_bench [--repeats 3] [--kind wait|costly] [--cost 500] [--settle-s 20]
        [--files 150 300 300] [--budget 5] [--markdown]

The job (``tests/autoscale_support.py``): three text sources of many small files with equal shares; ``code``
is expensive to tokenize (the test-only wrapper in ``tests/expensive_tokenizer``): with ``--kind wait`` it
sleeps ``--cost`` microseconds per token, as a loader with a machine of its own would spend the time; with
``--kind costly`` it tokenizes ``--cost`` times over, on this machine's 2 shared cores. Both runs start
with code 1, docs 2, notes 2 loaders (``--budget`` 5 in all; a larger budget goes to docs and notes); the
autoscaled run may move them within that budget (code 1-3, docs 1-2, notes 1-2). The job stops when a source
runs out.
Each run is a ``mixflow run`` on the broker at $KAFKA_BOOTSTRAP_SERVERS (default 127.0.0.1:9092). Reported,
medians over the runs:

- **stall fraction**: steps whose draw waited for a sample that was produced after the previous step was
  written (``pipeline/roles/autoscale/stalls.py``: a count read from the topics, a lower bound), over all steps
  and over the steps drawn after the first ``--settle-s`` seconds of the run (the warm-up left out);
- **tokens/s end to end**: tokens written to the rank topics / seconds from the start of ``mixflow run`` to
  the last step's state record (process start-up included, the same for both);
- **loader CPU-s per 1k tokens**: CPU seconds of every loader process (user + system, threads included, as
  each writes at exit) per thousand tokens the loaders committed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks._table import add_markdown_flag, print_table
from pipeline.roles.autoscale.stalls import job_stalls
from pipeline.spec import load_spec
from tests.autoscale_support import (
    build_job_data,
    decisions,
    job_folder,
    run_job,
    write_job_spec,
)
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent

BUDGET = 5
TRAINER_STALL = 0.1
"""A trainer's step stalled when it waited for its data more than this share of its compute."""
SCALING = {
    "interval_s": 1.0,
    "low_watermark_s": 5,
    "high_watermark_s": 10,
    "scale_down_after_s": 2,
    "lookahead_s": 10,
}


def allocation(budget: int) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """The fixed allocation (code 1, the rest split between docs and notes) and the autoscaled bounds (each
    source between 1 and what the others' min leave, the cheap ones no more than their fixed count)."""
    if budget < 3:
        msg = f"--budget must be at least 3 (one loader per source), got {budget}"
        raise SystemExit(msg)
    docs = (budget - 1) // 2
    loaders = {"code": 1, "docs": docs, "notes": budget - 1 - docs}
    return loaders, {"code": (1, budget - 2), "docs": (1, docs), "notes": (1, budget - 1 - docs)}


@dataclass
class RunResult:
    steps: int
    stalled: int
    settled_steps: int  # the steps drawn after the first --settle-s seconds, and how many of them stalled
    settled_stalled: int
    settled_by_source: dict[str, int]  # the settled steps that waited for each source
    tokens: int
    seconds: float
    loader_cpu_s: float
    loader_tokens: int
    peak: dict[str, int]
    trainer_waits: list[float]  # with --trainer-step-s: per settled step, the seconds the trainer waited
    trainer_step_s: float

    @property
    def trainer_stall_fraction(self) -> float:
        """Settled steps the trainer waited for more than a tenth of its compute."""
        waits = self.trainer_waits
        return sum(w > TRAINER_STALL * self.trainer_step_s for w in waits) / len(waits) if waits else 0.0

    @property
    def trainer_idle_share(self) -> float:
        """Of the trainer's settled time, the share it waited for data (a GPU's idle)."""
        waited = sum(self.trainer_waits)
        return waited / (waited + self.trainer_step_s * len(self.trainer_waits)) if self.trainer_waits else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.stalled / self.steps if self.steps else 0.0

    @property
    def settled_stall_fraction(self) -> float:
        return self.settled_stalled / self.settled_steps if self.settled_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_ms_per_ktoken(self) -> float:
        return 1e6 * self.loader_cpu_s / max(self.loader_tokens, 1)


def last_json(path: Path) -> dict:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def run_once(
    data: Path,
    bootstrap: str,
    autoscale: bool,
    cost: int,
    kind: str,
    settle_s: float,
    budget: int,
    folder: Path,
    trainer_step_s: float | None = None,
    lead: int = 8,
) -> RunResult:
    job = f"asb{uuid.uuid4().hex[:8]}"
    loaders, bounds = allocation(budget)
    scaling = {**SCALING, "max_total_loaders": budget} if autoscale else None
    spec_path = write_job_spec(
        folder / job,
        job,
        bootstrap,
        data,
        loaders,
        scaling,
        bounds if autoscale else None,
        costs={"code": f"{kind}{cost}"},
        constructor={"max_lead_steps": lead} if trainer_step_s else None,
    )
    trainer = None
    if trainer_step_s:
        script = REPO / "benchmarks" / "paced_trainer.py"
        trainer = f"{{python}} {script} --spec {{spec}} --out {{out}} --step-s {trainer_step_s}"
    cpu_log = folder / job / "cpu"
    cpu_log.mkdir(parents=True)
    os.environ["MIXFLOW_CPU_LOG"] = str(cpu_log)
    began_ms = time.time() * 1000
    try:
        run = run_job(spec_path, folder / job / "state", timeout_s=900, trainer=trainer)
    finally:
        del os.environ["MIXFLOW_CPU_LOG"]
    if run.returncode != 0:
        msg = f"mixflow run of {job} exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
        raise RuntimeError(msg)
    spec = load_spec(spec_path)
    config = spec.kafka.client_config()
    states = read_to_end(config, JobTopics(job).state)
    stalls, settled = job_stalls(config, spec, since_ms=[began_ms + 1000 * settle_s])
    logs = job_folder(folder / job / "state")
    constructed = last_json(logs / "construct.log")
    loader_tokens = sum(last_json(p).get("tokens", 0) for p in logs.glob("load-*.log"))
    cpu = [json.loads(p.read_text()) for p in cpu_log.glob("*.json")]
    loader_cpu = sum(c["cpu_seconds"] for c in cpu if "load" in c["argv"])
    made = decisions(folder / job / "state")
    peak = {s: max([d["running"] for d in made if d["source"] == s] or [n]) for s, n in loaders.items()}
    waits: list[float] = []
    if trainer_step_s:
        paced = json.loads((logs / "train" / "paced-trainer.json").read_text())
        settled_from = began_ms + 1000 * settle_s
        waits = [w for w, at in zip(paced["waits_s"], paced["starts_ms"], strict=True) if at >= settled_from]
    return RunResult(
        steps=stalls.steps,
        stalled=stalls.stalled,
        settled_steps=settled.steps,
        settled_stalled=settled.stalled,
        settled_by_source=settled.by_source,
        tokens=int(constructed.get("tokens", 0)),
        seconds=(states[-1].timestamp()[1] - began_ms) / 1000,
        loader_cpu_s=loader_cpu,
        loader_tokens=loader_tokens,
        peak=peak,
        trainer_waits=waits,
        trainer_step_s=trainer_step_s or 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each allocation (default: %(default)s)")
    parser.add_argument("--cost", type=int, default=500, help="microseconds per token (wait) or times over (costly)")
    parser.add_argument(
        "--kind",
        choices=["costly", "wait"],
        default="wait",
        help="wait: the expensive source sleeps per token (a loader with a machine of its own); costly: it "
        "burns this machine's CPU",
    )
    parser.add_argument("--files", type=int, nargs=3, default=[150, 300, 300], metavar=("CODE", "DOCS", "NOTES"))
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="the warm-up left out of the settled stall fraction (seconds)"
    )
    parser.add_argument("--budget", type=int, default=BUDGET, help="loaders of all sources (default: %(default)s)")
    parser.add_argument(
        "--trainer-step-s",
        type=float,
        help="run a paced trainer (benchmarks/paced_trainer.py: every rank, this many seconds of compute a step) "
        "and bound the constructor's lead over it (--lead); reports the trainer's stalls (default: no trainer)",
    )
    parser.add_argument(
        "--lead", type=int, default=8, help="constructor.max_lead_steps with a trainer (default: %(default)s)"
    )
    add_markdown_flag(parser)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    loaders, _ = allocation(args.budget)
    with tempfile.TemporaryDirectory(prefix="autoscale-bench-") as tmp:
        folder = Path(tmp)
        data = build_job_data(folder / "data", dict(zip(("code", "docs", "notes"), args.files, strict=True)))
        results: dict[str, list[RunResult]] = {"fixed": [], "autoscaled": []}
        for _ in range(args.repeats):  # interleaved, so that both see the same load on the machine
            for name in results:
                results[name].append(
                    run_once(
                        data,
                        bootstrap,
                        name == "autoscaled",
                        args.cost,
                        args.kind,
                        args.settle_s,
                        args.budget,
                        folder,
                        args.trainer_step_s,
                        args.lead,
                    )
                )
                r = results[name][-1]
                print(
                    f"{name}: {r.steps} steps, {r.stalled} stalled ({r.settled_stalled} of {r.settled_steps} after "
                    f"{args.settle_s:g} s, waiting for {r.settled_by_source}), {r.tokens} tokens in {r.seconds:.1f} s, "
                    f"loader CPU {r.loader_cpu_s:.1f} s for {r.loader_tokens} tokens, peak loaders {r.peak}"
                    + (
                        f", trainer stalled {r.trainer_stall_fraction:.1%} of {len(r.trainer_waits)} settled steps, "
                        f"idle {r.trainer_idle_share:.1%}"
                        if args.trainer_step_s
                        else ""
                    ),
                    file=sys.stderr,
                )

    def median(name: str, value) -> float:  # type: ignore[no-untyped-def]
        return statistics.median(value(r) for r in results[name])

    rows = []
    if args.trainer_step_s:
        rows += [
            [
                f"trainer stall fraction after {args.settle_s:g} s (waited > {TRAINER_STALL:.0%} of its step)",
                *(f"{median(n, lambda r: r.trainer_stall_fraction):.1%}" for n in results),
            ],
            [
                f"trainer idle share after {args.settle_s:g} s",
                *(f"{median(n, lambda r: r.trainer_idle_share):.1%}" for n in results),
            ],
        ]
    rows += [
        [
            "constructor stall fraction (steps that waited)",
            *(f"{median(n, lambda r: r.stall_fraction):.1%}" for n in results),
        ],
        [
            f"constructor stall fraction after the first {args.settle_s:g} s",
            *(f"{median(n, lambda r: r.settled_stall_fraction):.1%}" for n in results),
        ],
        [
            f"steps (after the first {args.settle_s:g} s)",
            *(f"{median(n, lambda r: r.steps):.0f} ({median(n, lambda r: r.settled_steps):.0f})" for n in results),
        ],
        ["end-to-end tokens/s", *(f"{median(n, lambda r: r.tokens_per_second):.0f}" for n in results)],
        ["seconds to the last step", *(f"{median(n, lambda r: r.seconds):.1f}" for n in results)],
        ["loader CPU-ms per 1k tokens", *(f"{median(n, lambda r: r.cpu_ms_per_ktoken):.1f}" for n in results)],
        [
            "peak loaders code/docs/notes",
            *("/".join(str(max(r.peak[s] for r in results[n])) for s in loaders) for n in results),
        ],
    ]
    title = (
        f"Fixed allocation against autoscaling, budget {args.budget} loaders, code {args.kind} {args.cost}, "
        f"files {args.files}, medians of {args.repeats} runs each"
    )
    fixed = "/".join(str(n) for n in loaders.values())
    print_table(
        ["", f"fixed ({fixed})", f"autoscaled (budget {args.budget})"], rows, title=title, markdown=args.markdown
    )


if __name__ == "__main__":
    main()
