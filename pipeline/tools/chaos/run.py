"""One chaos run: a whole job (loaders, an active constructor and its shadows, one sink per rank) as
processes, faults injected by a seeded schedule, then a drain to the end of the job and an audit.

The job streams (``on_exhausted: next_epoch``) while faults are injected, so every role keeps working
however long the faults take. Each fault waits until the one before is survived: the job wrote a step
after it and a killed role runs again (a killed sink has received a step since, the constructors are all
back in the lease group). To end, the loaders and constructors are stopped and started again under the
same spec with ``on_exhausted: renormalize``: they finish the epochs planned, the constructor writes what
is left and the end-of-data record, and the sinks end there. The audit then reads the topics.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from pathlib import Path

import yaml

from pipeline.spec import JobSpec, load_spec
from pipeline.tools.chaos.access import revocable_principals
from pipeline.tools.chaos.audit import audit_job
from pipeline.tools.chaos.live import LiveJob
from pipeline.tools.chaos.object_store import ChaosObjectStore
from pipeline.tools.chaos.options import ChaosError, ChaosOptions
from pipeline.tools.chaos.report import ChaosReport
from pipeline.tools.chaos.schedule import DEFAULT_WEIGHTS, Fault, Targets, plan_faults
from pipeline.tools.chaos.secured import RunPrincipals, grant_job_acls, principal_keys, secured_broker
from pipeline.tools.stack.local_broker import LocalBroker, default_state_dir, free_port_block, free_port_pair
from topics.errors import MixflowError, RefusedError
from topics.kafka.acl_admin import AclAdmin
from topics.kafka.admin import ensure_job_topics

__all__ = ["ChaosError", "ChaosOptions", "run_chaos"]

log = logging.getLogger(__name__)


def run_chaos(options: ChaosOptions) -> ChaosReport:
    """Run the job of ``options.spec`` under the faults of ``options.seed``; report. Logs, the specs, the
    sinks' records and ``report.json`` go to ``options.out`` (the private broker's folder too)."""
    began = time.monotonic()
    if options.secure and options.bootstrap is not None:
        msg = "a secured chaos run (--secure) starts a secured broker of its own: leave out --bootstrap-servers"
        raise MixflowError(msg)
    job = f"chaos-{options.seed}-{uuid.uuid4().hex[:6]}"
    folder = (options.out or default_state_dir() / "chaos" / job).absolute()
    if folder.exists() and any(folder.iterdir()):
        msg = f"{folder} holds files already (a run's sink checkpoints would be taken up): give a new or empty folder"
        raise RefusedError(msg)
    base = load_spec(options.spec)
    if base.constructor.lanes > 1:
        msg = (
            f"mixflow chaos runs one constructor lane; {options.spec} has constructor.lanes "
            f"{base.constructor.lanes} (lanes under SIGKILL are tested by tests/test_lanes.py)"
        )
        raise MixflowError(msg)
    targets = _targets(options, base)
    if options.kinds is not None and (missing := targets.missing(options.kinds)):
        msg = f"--kinds: this run cannot inject {'; '.join(missing)}"
        raise MixflowError(msg)
    store = None
    if options.object_store is not None:  # s3:// sources: the loaders read with a user of the run's own
        store = ChaosObjectStore.running(options.object_store, user=bool(targets.storage_loaders))
    folder.mkdir(parents=True, exist_ok=True)
    faults = _schedule(options, targets)
    report = ChaosReport(job, options.seed, options.shadows, targets.broker, folder, planned=faults)
    report.secured = options.secure
    broker = None if options.bootstrap else _private_broker(folder / "broker", options.secure)
    try:
        bootstrap = broker.up() if broker is not None else str(options.bootstrap)
        if store is not None:
            store.open()
        principals = None
        if broker is not None and options.secure:
            principals = RunPrincipals.create(folder, job, base.source_names, broker)
        spec, streaming, draining = _write_specs(
            options.spec, job, bootstrap, folder, options.max_lead_steps, store, principals
        )
        if broker is not None and principals is not None:
            grant_job_acls(broker, spec)  # before the operator creates the topics
        config = spec.kafka.client_config(bootstrap, role="operator")
        ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks, lanes=spec.constructor.lanes)
        acls = AclAdmin(broker.security.client) if broker is not None and broker.security is not None else None
        remote = tuple(source.name for source in base.sources if source.in_object_store)
        live = LiveJob(options, spec, config, folder, broker, store, acls=acls, remote=remote)
        try:
            live.run(faults, streaming, draining, report)
        finally:
            live.close()
            report.refusals = list(live.supervisor.refusals)
            report.failures = list(live.supervisor.failures)
            report.errors_logged = live.supervisor.logged_errors()
            report.stuck_restarts = live.supervisor.stuck_restarts()
            report.unreachable_restarts = live.supervisor.unreachable_restarts()
        if report.error is None:
            phase = time.monotonic()
            with store.environ() if store is not None else contextlib.nullcontext():  # s3:// sources: keys
                report.audit = audit_job(config, spec, folder / "sinks")
            report.phases_s["audit"] = time.monotonic() - phase
    finally:
        if store is not None:
            store.close()
        if broker is not None:
            broker.down()
        report.wall_s = time.monotonic() - began
        (folder / "report.json").write_text(report.to_json())
    return report


def _targets(options: ChaosOptions, base: JobSpec) -> Targets:
    """What a run of ``base`` under ``options`` can strike: its roles, its broker when it is the run's own, its
    object store, and the rights it can revoke (the roles' ACLs when secured, the storage key of s3:// sources)."""
    remote = [s for s in base.sources if s.in_object_store] if options.object_store is not None else []
    return Targets(
        loaders=tuple(f"load-{s.name}-{i}" for s in base.sources for i in range(s.loaders)),
        sinks=tuple(f"sink-{r}" for r in range(base.step.ranks)),
        shadows=options.shadows,
        broker=options.bootstrap is None,
        object_store=options.object_store is not None,
        principals=revocable_principals(principal_keys(base.source_names)) if options.secure else (),
        storage_loaders=tuple(f"load-{s.name}-{i}" for s in remote for i in range(s.loaders)),
    )


def _schedule(options: ChaosOptions, targets: Targets) -> tuple[Fault, ...]:
    kinds = targets.kinds() if options.kinds is None else options.kinds
    weights = {kind: weight for kind, weight in DEFAULT_WEIGHTS.items() if kind in kinds}
    maxima = {
        "max_pause_s": options.max_pause_s,
        "max_down_s": options.max_down_s,
        "max_stall_s": options.max_stall_s,
        "max_revoke_s": options.max_revoke_s,
    }
    return plan_faults(options.seed, options.faults, targets, weights, **maxima)


def _private_broker(state_dir: Path, secure: bool) -> LocalBroker:
    port = free_port_block(3) if secure else free_port_pair()  # a secured broker's mTLS listener: port + 2
    return secured_broker(state_dir, port) if secure else LocalBroker(state_dir, port=port)


def _write_specs(
    spec_path: Path,
    job: str,
    bootstrap: str,
    folder: Path,
    max_lead_steps: int | None,
    store: ChaosObjectStore | None = None,
    principals: RunPrincipals | None = None,
) -> tuple[JobSpec, Path, Path]:
    """The spec under ``job`` on ``bootstrap`` (and the object store's proxy; a secured run's principals),
    streaming (``spec.yaml``), and for the drain."""
    body = load_spec(spec_path).model_dump(mode="json", exclude_none=True)
    if store is not None:
        body = store.for_run(body)
    body["job"] = job
    body["kafka"] = {**body.get("kafka", {}), "bootstrap_servers": bootstrap}
    if principals is not None:
        body["kafka"] = principals.kafka_section(body["kafka"])
    if max_lead_steps is not None:
        body["constructor"] = {**body.get("constructor", {}), "max_lead_steps": max_lead_steps}
    paths = []
    for name, policy in (("spec.yaml", "next_epoch"), ("drain-spec.yaml", "renormalize")):
        path = folder / name
        path.write_text(yaml.safe_dump({**body, "on_exhausted": policy}, sort_keys=False))
        paths.append(path)
    return load_spec(paths[0]), paths[0], paths[1]
