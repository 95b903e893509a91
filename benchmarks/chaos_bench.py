"""Chaos benchmark: the example job under 100+ random faults (SIGKILLs of loaders, of the active and the
shadow constructor and of the trainer sinks; broker restarts; with ``--secure``, revoked ACLs; with
``--object-store``, object store restarts, stalls, slow and refusing spells and a revoked storage key), then an
audit that nothing was lost or repeated and that no role failed on its own.

    .venv/bin/python -m benchmarks.chaos_bench [--faults 100] [--seed 1] [--shadows 1] [--out DIR] [--multimodal]
        [--secure] [--object-store] [--max-lead-steps N]

It runs what `mixflow chaos --spec examples/example.yaml --faults N --seed S` runs (building the example
data first when examples/data is missing), on a private broker; with ``--multimodal``, the multimodal example
job instead (examples/multimodal.yaml: image-text pairs, interleaved documents and clips beside text, built
by examples/build_multimodal_data.py), whose audit compares every sample's media bytes too. ``--secure``
secures the broker (a principal and ACLs per role, `mixflow chaos --secure`); ``--object-store`` starts a local
object store in the output folder, puts every source's files in a bucket there and runs the job from it
(`mixflow chaos --object-store-dir`), its loaders reading with a key of the run's own. It prints the faults by
kind with the time each took to be survived, and the run's totals: roles that failed on their own, roles
stopped by revoked rights, the takeover gaps after killing the active constructor, the broker's time away, what
the audit found, the wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml

from benchmarks._table import add_markdown_flag, print_table
from pipeline.cli import main as mixflow
from pipeline.spec import load_spec
from pipeline.tools.chaos import ChaosOptions, ChaosReport, FaultKind, run_chaos
from pipeline.tools.stack.local_broker import free_port_block
from pipeline.tools.stack.object_store import REGION, LocalObjectStore

REPO = Path(__file__).resolve().parent.parent


def example_spec(multimodal: bool = False) -> Path:
    """examples/example.yaml, or examples/multimodal.yaml, with its data built when missing."""
    built, script, spec = ("tokenizer.json", "build_example_data.py", "example.yaml")
    if multimodal:
        built, script, spec = ("mm-tokenizer.json", "build_multimodal_data.py", "multimodal.yaml")
    if not (REPO / "examples" / "data" / built).exists():
        subprocess.run([sys.executable, str(REPO / "examples" / script)], check=True, cwd=REPO)
    return REPO / "examples" / spec


@contextlib.contextmanager
def in_object_store(spec: Path, folder: Path) -> Iterator[tuple[Path, Path]]:
    """A local object store in ``folder/store`` holding each source of ``spec`` under ``s3://chaos-data/<name>``,
    and a copy of ``spec`` that reads them from there: (that spec, the store's folder); the store stops after."""
    store = LocalObjectStore(folder / "store", port=free_port_block(1))
    endpoint = store.start()
    try:
        loaded = load_spec(spec)
        body = loaded.model_dump(mode="json", exclude_none=True)
        where = ("--object-store-dir", str(store.state_dir))
        for source in body["sources"]:
            uri = f"s3://chaos-data/{source['name']}"
            assert mixflow(["objects", "put", source["path"], uri, "--create-bucket", *where]) == 0, uri
            source["path"] = uri
        body["storage"] = {"endpoint_url": endpoint, "region": REGION, "addressing_style": "path"}
        copy = folder / "object-store-spec.yaml"
        copy.write_text(yaml.safe_dump(body, sort_keys=False))
        yield copy, store.state_dir
    finally:
        store.stop()


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
    refused = f"{len(report.refusals)} ({len({r.role for r in report.refusals})} roles)"
    totals = [
        ["faults injected / survived", f"{len(report.injected)} / {report.survived} of {len(report.planned)}"],
        ["roles that failed on their own", f"{len(report.failures)} ({stuck} stuck Kafka clients, exit 3)"],
        ["roles stopped by revoked rights (exit 5 naming them), started again once back", refused],
        [
            "takeover gap after killing the active constructor, median / worst s",
            f"{gap_median} / {gap_worst} ({len(report.gaps_s)} kills, {report.shadows} shadow)",
        ],
        ["broker away per restart, median / worst s", f"{away_median} / {away_worst}"],
        ["steps written (every rank, contiguous, within capacity)", audit.steps if audit else "-"],
        ["samples exactly once with their tokens", f"{audit.samples} of {audit.expected}" if audit else "-"],
        ["dead letters (each one the data gives)", audit.dead_letters if audit else "-"],
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
        "--kinds", help="kinds of fault, comma-separated (default: every kind the run has a target for)"
    )
    parser.add_argument("--secure", action="store_true", help="a secured broker, a principal and ACLs per role")
    parser.add_argument(
        "--object-store", action="store_true", help="the sources in a local object store the run starts"
    )
    parser.add_argument("--max-revoke-s", type=float, default=5.0, help="rights revoked 1 s up to this long")
    parser.add_argument("--out", type=Path, help="logs and report.json (default: a temporary folder)")
    parser.add_argument("--max-lead-steps", type=int, help="constructor.max_lead_steps (default: the spec's)")
    add_markdown_flag(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-bench-"))
    spec = args.spec or example_spec(args.multimodal)
    with contextlib.ExitStack() as stack:
        store = None
        if args.object_store:
            spec, store = stack.enter_context(in_object_store(spec, out))
        options = ChaosOptions(
            spec=spec,
            faults=args.faults,
            seed=args.seed,
            out=out / "run",
            shadows=args.shadows,
            kinds=tuple(FaultKind(kind) for kind in args.kinds.split(",")) if args.kinds else None,
            max_lead_steps=args.max_lead_steps,
            object_store=store,
            max_revoke_s=args.max_revoke_s,
            secure=args.secure,
        )
        report = run_chaos(options)
    print(f"\nchaos run on {len(report.planned)} faults, seed {args.seed}; logs and report.json in {out / 'run'}")
    print_report(report, args.markdown)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
