"""``replay``: rebuild steps of a job into another job, under its own step shape or another one."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pipeline.kafka.control import broken_control_records
from pipeline.kafka.spec_record import read_spec_records
from pipeline.kafka.state_topic import JobHistory, read_history, require_history
from pipeline.planning.scheduler.context_parallel import cp_shape_of
from pipeline.planning.scheduler.cp_plan import CPShape
from pipeline.planning.shape import StepShape
from pipeline.roles.constructor import ConstructorOptions, DataConstructor
from pipeline.spec import JobSpec
from pipeline.tools.replay.audit import Audit, audit
from pipeline.tools.replay.elastic import ElasticReplay
from pipeline.tools.replay.plan import ReplayMode, ReplayPlan, ReplayRequest, plan_replay
from pipeline.tools.replay.specs import replay_specs
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.step_index import locate_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplaySummary:
    """What a replay run did: ``written`` the steps it wrote (consecutive), and where the target stands after it.
    ``context_parallel``: a context-parallel job's shape of the replay (``shape`` is its written part)."""

    job: str
    target: str
    mode: ReplayMode
    shape: StepShape
    from_step: int
    written: range
    steps: int
    finished: bool
    seconds: float
    context_parallel: CPShape | None = None

    def to_dict(self) -> dict[str, object]:
        cp = self.context_parallel
        out: dict[str, object] = {
            "job": self.job,
            "to_job": self.target,
            "mode": self.mode.value,
            "ranks": self.shape.ranks,
            "micro_batches": self.shape.micro_batches if cp is None else cp.micro_batches,
            "from_step": self.from_step,
            "steps_replayed": len(self.written),
            "first_replayed": self.written[0] if self.written else None,
            "last_replayed": self.written[-1] if self.written else None,
            "next_step": self.steps,
            "finished": self.finished,
            "seconds": round(self.seconds, 3),
        }
        if cp is not None:
            out["context_parallel"] = {
                "mode": cp.mode.value,
                "size": cp.size,
                "max_micro_batches": cp.max_micro_batches,
            }
        return out


def replay(
    spec: JobSpec, config: KafkaConfig, request: ReplayRequest, transaction_timeout_ms: int = 60_000
) -> ReplaySummary:
    """Write steps of ``spec``'s job into ``request.target``, or continue an earlier run that was stopped."""
    began = time.monotonic()
    job = request.job or spec.job
    if spec.constructor.lanes > 1:
        msg = (
            f"mixflow replay of job {job}: its spec has constructor.lanes {spec.constructor.lanes}, and replay "
            "supports one lane only. To check a lane's determinism, run its lanes again into another job "
            "(mixflow construct --lane J --output-job NAME) and compare the rank topics partition by partition"
        )
        raise MixflowError(msg)
    original = require_history(config, job)
    _say_broken_control_records(config, original)
    target = read_history(config, request.target)
    plan = plan_replay(
        request,
        original,
        StepShape.from_spec(spec.step).written(),
        target,
        _first_step(config, request.target) if target is not None and target.records else None,
        cp_shape_of(spec.step),
    )
    written = range(0)
    finished = target is not None and target.finished
    if plan.done:
        log.info("replay of %s into %s: nothing left to write", job, request.target)
    else:
        if plan.first > plan.from_step:
            log.info("replay of %s into %s: continuing at step %d", job, request.target, plan.first)
        written, finished = _write(spec, config, request.target, original, plan, transaction_timeout_ms)
    return ReplaySummary(
        job=job,
        target=request.target,
        mode=plan.mode,
        shape=plan.shape,
        from_step=plan.from_step,
        written=written,
        steps=written[-1] + 1 if written else (target.steps if target is not None and target.records else 0),
        finished=finished,
        seconds=time.monotonic() - began,
        context_parallel=plan.context_parallel,
    )


def _say_broken_control_records(config: KafkaConfig, original: JobHistory) -> None:
    """Warn of each record on the original's control topic that steers the job and does not decode: its
    constructor skipped it, and so does the replay, from the first step written after it."""
    for broken in broken_control_records(config, JobTopics(original.job)):
        step = original.first_step_after(broken.timestamp_ms)
        when = f"at step {step}, the first written after it" if step is not None else "after the last step written"
        log.warning(
            "%s[0]@%d (key %s) does not decode, and the job skipped it %s: %s",
            JobTopics(original.job).control,
            broken.offset,
            broken.key,
            when,
            broken.problem,
        )


def verify(config: KafkaConfig, job: str, target: str, from_step: int, mode: ReplayMode | None = None) -> Audit:
    """The determinism audit of ``target`` (a replay of ``job`` from ``from_step``, in ``mode``; None: byte for
    byte where the two jobs' written shapes are the same) against ``job``."""
    same_shape = None if mode is None else mode is ReplayMode.RERUN
    return audit(config, require_history(config, job), require_history(config, target), from_step, same_shape)


def _write(
    spec: JobSpec, config: KafkaConfig, target: str, original: JobHistory, plan: ReplayPlan, timeout_ms: int
) -> tuple[range, bool]:
    """The steps written, and whether the target job has ended."""
    if plan.mode is ReplayMode.REPLAN:
        cost_model, vision = spec.cost.cost_model(), spec.cost.vision_cost_model()
        cp, cp_cost = plan.context_parallel, spec.cost.context_parallel_cost()
        role = ElasticReplay(config, original, target, plan.shape, cost_model, timeout_ms, vision, cp, cp_cost)
        written = role.run(plan.first, plan.last, plan.end)
        return written, role.finished
    records = read_spec_records(config, JobTopics(original.job))
    first = last = None
    finished = False
    stretches = replay_specs(original.job, spec, records, plan.first, plan.last)
    for index, stretch in enumerate(stretches):
        if stretch.warning is not None:
            log.warning("%s", stretch.warning)
        elif len(stretches) > 1:
            log.info("replaying steps %d to %d under the spec in force there", stretch.first, stretch.last)
        to_the_end = plan.end and index == len(stretches) - 1
        options = ConstructorOptions(
            output_job=target,
            # A job that ended ends the same way again, after the same steps (and mixing stops by itself there).
            max_steps=None if to_the_end else stretch.last + 1 - stretch.first,
            transaction_timeout_ms=timeout_ms,
            start_state=plan.start_state,  # used only while the target holds no state yet
            replay_changes=plan.changes,
        )
        stats = DataConstructor(stretch.spec, config, options).run()
        finished = stats.finished
        if stats.first_step is not None and stats.last_step is not None:
            first = stats.first_step if first is None else first
            last = stats.last_step
        if finished or last is None or last < stretch.last:  # stopped early (a signal, or the end)
            break
    written = range(0) if first is None or last is None else range(first, last + 1)
    return written, finished


def _first_step(config: KafkaConfig, job: str) -> int | None:
    """The first step on ``job``'s rank 0 (which must exist), None when it holds none."""
    record = locate_step(config, JobTopics(job).rank(0), 0).record
    return None if record is None or record.end else record.step
