"""How long `mixflow top` and `mixflow report` take on a finished job, next to `mixflow run`'s end-of-job
report (``pipeline.tools.observe.rank_topics.job_report``) on the same job, the same broker and the same process.

    .venv/bin/python -m benchmarks.observe_bench --spec .mixflow/jobs/<job>/spec.yaml [--repeats 3]

Per repeat: the end-of-job report (baseline: reads every rank topic, the state topic, every source topic
and the dead letters); ``mixflow report`` (every rank topic, the state topic, one offset lookup per source
and backlog point, four PNGs); a first ``top`` frame (reads every rank topic from the beginning) and a
second frame with the same collector (only what was added since, which is nothing on a finished job).
Medians of the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._table import add_markdown_flag, print_table
from pipeline.spec import load_spec
from pipeline.tools.observe.collector import JobCollector
from pipeline.tools.observe.frame import build_frame
from pipeline.tools.observe.rank_topics import job_report
from pipeline.tools.observe.report import write_report

REPO = Path(__file__).resolve().parent.parent


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True, help="the spec of a finished job (as mixflow run wrote it)")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--repeats", type=int, default=3)
    add_markdown_flag(parser)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers)
    times: dict[str, list[float]] = {"baseline": [], "report": [], "top first": [], "top next": []}
    for _ in range(args.repeats):
        times["baseline"].append(timed(lambda: job_report(config, spec)))
        with tempfile.TemporaryDirectory() as out:
            times["report"].append(timed(lambda out=out: write_report(config, spec, Path(out))))
        collector = JobCollector(config, spec)
        try:
            times["top first"].append(timed(lambda c=collector: build_frame(c.collect(budget_s=300))))
            times["top next"].append(timed(lambda c=collector: build_frame(c.collect(budget_s=300))))
        finally:
            collector.close()
    base = statistics.median(times["baseline"])
    names = {
        "baseline": "`mixflow run`'s end-of-job report (baseline)",
        "report": "`mixflow report` (4 PNGs + report.md)",
        "top first": "`mixflow top`, first frame",
        "top next": "`mixflow top`, next frame",
    }
    rows = [[names[k], f"{statistics.median(v):.2f}", f"{statistics.median(v) / base:.2f}x"] for k, v in times.items()]
    print_table(
        ["what", "seconds (median)", "vs baseline"],
        rows,
        title=f"job {spec.job}, {args.repeats} repeats",
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
