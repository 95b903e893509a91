"""`mixflow chaos --spec SPEC --faults N --seed S`: run a whole job under random faults, then audit it."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from pipeline.cli.arguments import non_negative_int, output_folder, positive_float, positive_int
from pipeline.tools.chaos.schedule import FaultKind


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec (run under a fresh job name)")
    parser.add_argument("--faults", type=non_negative_int, required=True, help="faults to inject, one after the other")
    parser.add_argument("--seed", type=int, required=True, help="seed of the fault schedule")
    parser.add_argument(
        "--shadows",
        type=non_negative_int,
        default=1,
        help="shadow constructors beside the active one (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=output_folder,
        help="a new or empty folder for the logs, the sinks' records, report.json and the private broker "
        "(default: $MIXFLOW_STATE_DIR or .mixflow, then chaos/<job>)",
    )
    parser.add_argument(
        "--bootstrap-servers",
        help="run on this broker instead of a private one (then the broker is never restarted)",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="the run's broker is secured as `mixflow stack up --secure` makes it (SASL_SSL, SCRAM-SHA-512, ACLs "
        "enforced; its restarts keep that); each role runs as a SCRAM user of its own (passwords in principals/ of "
        "the run's folder, owner only) with the job's ACLs of `mixflow acl plan`, applied before the roles start; "
        "fault kind revoke-acls then deletes one principal's bindings (a source's loaders, the constructors, the "
        "trainers) a while and creates them again: every role of it must stop with exit 5 naming the refusal, and "
        "is started again once they are back. Goes with --object-store-dir; not with --bootstrap-servers",
    )
    parser.add_argument(
        "--object-store-dir",
        type=Path,
        default=None,
        help="the folder of a running local object store (`mixflow stack object-store up`) that the spec's s3:// "
        "sources read: the run restarts, stalls, slows and refuses it (restart-object-store, stall-object-store, "
        "slow-object-store, refuse-object-store) and gives the roles its endpoint; with s3:// sources the loaders "
        "read with the keys of a user the run adds to the store, which revoke-storage-key removes a while (the "
        "loaders must stop with exit 5, no dead letter for it) and adds back (default: none, and no object store "
        "faults)",
    )
    parser.add_argument(
        "--max-stall-s",
        type=positive_float,
        default=5.0,
        help="a stall-object-store fault stops the store for 1 s up to this long (default: %(default)s)",
    )
    parser.add_argument(
        "--max-revoke-s",
        type=positive_float,
        default=5.0,
        help="revoke-acls and revoke-storage-key keep the rights away for 1 s up to this long, and then until the "
        "roles they strike have stopped with the refusal (default: %(default)s)",
    )
    parser.add_argument(
        "--kinds",
        type=_kinds,
        default=None,
        help="the kinds of fault, comma-separated, each needing its target (default: every kind this run has a "
        "target for, of " + ", ".join(FaultKind) + ")",
    )
    parser.add_argument(
        "--max-lead-steps",
        type=positive_int,
        help="the constructor stays at most this many steps ahead of the slowest sink (constructor.max_lead_steps; "
        "default: the spec's)",
    )
    parser.add_argument(
        "--fault-timeout-s",
        type=positive_float,
        default=120.0,
        help="how long each fault may take to be survived before the run fails (default: %(default)s)",
    )


def _kinds(text: str) -> tuple[FaultKind, ...]:
    try:
        return tuple(FaultKind(kind.strip()) for kind in text.split(","))
    except ValueError as exc:
        msg = f"{exc}; the kinds are {', '.join(FaultKind)}"
        raise argparse.ArgumentTypeError(msg) from exc


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    from pipeline.tools.chaos import ChaosOptions, run_chaos

    # A run stopped from outside still ends its roles and its private broker.
    signal.signal(signal.SIGTERM, _interrupt)
    options = ChaosOptions(
        spec=args.spec,
        faults=args.faults,
        seed=args.seed,
        out=args.out,
        shadows=args.shadows,
        bootstrap=args.bootstrap_servers,
        kinds=args.kinds,
        fault_timeout_s=args.fault_timeout_s,
        max_lead_steps=args.max_lead_steps,
        object_store=args.object_store_dir,
        max_stall_s=args.max_stall_s,
        max_revoke_s=args.max_revoke_s,
        secure=args.secure,
    )
    report = run_chaos(options)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1
