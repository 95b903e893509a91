"""Chaos benchmark: the example job under 100+ random faults (SIGKILLs of loaders, of the active and the
shadow constructor and of the trainer sinks; broker restarts), then an audit that nothing was lost or
repeated and that no role failed on its own.

    .venv/bin/python -m benchmarks.chaos_bench [--faults 100] [--seed 1] [--shadows 1] [--out DIR] [--multimodal]

It runs what `mixflow chaos --spec examples/example.yaml --faults N --seed S` runs (building the example
data first when examples/data is missing), on a private broker; with ``--multimodal``, the multimodal example
job instead (examples/multimodal.yaml: image-text pairs, interleaved documents and clips beside text, built
by examples/build_multimodal_data.py), whose audit compares every sample's media bytes too. It prints the
faults by kind with the time each took to be survived, and the run's totals: roles that failed on their own,
the takeover gaps after killing the active constructor, the broker's time away, what the audit found, the
wall time.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._table import add_markdown_flag, print_table
from pipeline.tools.chaos import ChaosOptions, ChaosReport, FaultKind, run_chaos

REPO = Path(__file__).resolve().parent.parent


def example_spec(multimodal: bool = False) -> Path:
    """examples/example.yaml, or examples/multimodal.yaml, with its data built when missing."""
    built, script, spec = ("tokenizer.json", "build_example_data.py", "example.yaml")
    if multimodal:
        built, script, spec = ("mm-tokenizer.json", "build_multimodal_data.py", "multimodal.yaml")
    if not (REPO / "examples" / "data" / built).exists():
        subprocess.run([sys.executable, str(REPO / "examples" / script)], check=True, cwd=REPO)
    return REPO / "examples" / spec


def seconds(values: list[float]) -> tuple[str, str]:
    """Median and worst, or dashes."""
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.2f}", f"{max(values):.2f}"


def print_report(report: ChaosReport, markdown: bool) -> None:
    rows = []
    for kind, (injected, survived) in sorted(report.by_kind().items()):
        recovery = [f.survived_s for f in report.injected if f.fault.kind is kind and f.survived_s is not None]
        rows.append([kind.value, injected, survived, *seconds(recovery)])
    title = f"Faults by kind (seed {report.seed}; survived: the job wrote a step after it and the role was back)"
    print_table(
        ["fault", "injected", "survived", "to survive, median s", "worst s"], rows, title=title, markdown=markdown
    )

    gap_median, gap_worst = seconds(report.gaps_s)
    broker_downs = [
        f.down_s for f in report.injected if f.down_s is not None and f.fault.kind is FaultKind.RESTART_BROKER
    ]
    away_median, away_worst = seconds(broker_downs)
    audit = report.audit
    stuck = sum(f.code == 3 for f in report.failures)
    totals = [
        ["faults injected / survived", f"{len(report.injected)} / {report.survived} of {len(report.planned)}"],
        ["roles that failed on their own", f"{len(report.failures)} ({stuck} stuck Kafka clients, exit 3)"],
        [
            "takeover gap after killing the active constructor, median / worst s",
            f"{gap_median} / {gap_worst} ({len(report.gaps_s)} kills, {report.shadows} shadow)",
        ],
        ["broker away per restart, median / worst s", f"{away_median} / {away_worst}"],
        ["steps written (every rank, contiguous, within capacity)", audit.steps if audit else "-"],
        ["samples exactly once with their tokens", f"{audit.samples} of {audit.expected}" if audit else "-"],
        [
            "audit: nothing lost, repeated or changed; sink records equal the topics",
            "yes" if audit and audit.ok else "NO",
        ],
        ["wall time s", f"{report.wall_s:.0f} (" + ", ".join(f"{k} {v:.0f}" for k, v in report.phases_s.items()) + ")"],
    ]
    print_table(["", "value"], totals, title="Run", markdown=markdown)
    if not report.ok:
        print("\n".join(line for line in report.lines() if "problem" in line or "ERROR" in line or "failure" in line))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shadows", type=int, default=1)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--spec", type=Path, help="default: examples/example.yaml")
    which.add_argument(
        "--multimodal", action="store_true", help="the multimodal example job (examples/multimodal.yaml) instead"
    )
    parser.add_argument(
        "--kinds", default=",".join(FaultKind), help="kinds of fault, comma-separated (default: every kind)"
    )
    parser.add_argument("--out", type=Path, help="logs and report.json (default: a temporary folder)")
    parser.add_argument("--max-lead-steps", type=int, help="constructor.max_lead_steps (default: the spec's)")
    add_markdown_flag(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-bench-"))
    options = ChaosOptions(
        spec=args.spec or example_spec(args.multimodal),
        faults=args.faults,
        seed=args.seed,
        out=out,
        shadows=args.shadows,
        kinds=tuple(FaultKind(kind) for kind in args.kinds.split(",")),
        max_lead_steps=args.max_lead_steps,
    )
    report = run_chaos(options)
    print(f"\nchaos run on {len(report.planned)} faults, seed {args.seed}; logs and report.json in {out}")
    print_report(report, args.markdown)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
