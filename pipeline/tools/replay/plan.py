"""What a replay will do, decided from the two jobs' histories before anything is written. Pure: no Kafka.

Every input a user can get wrong is refused here, naming it: the target being the original, a step the
original has not written, a spec whose step shape is not the original's, a rank count a context-parallel job's
mode cannot use, or a target that holds something other than this replay's earlier progress.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from pipeline.kafka.state_topic import JobHistory
from pipeline.planning.mixing import MixtureChange
from pipeline.planning.scheduler.cp_plan import CPShape
from pipeline.planning.shape import StepShape
from pipeline.planning.step.state import ConstructorState
from pipeline.tools.replay.reshape import default_micro_batches
from pipeline.tools.replay.reshape_cp import replay_cp_shape
from topics.errors import MixflowError, RefusedError
from topics.formats.names import validate_job_name


class ReplayMode(StrEnum):
    RERUN = "rerun"
    """The original's step shape: the constructor mixes again from the state of the first step."""
    REPLAN = "replan"
    """Another step shape: each step's samples, read from the original's rank topics, planned again."""


@dataclass(frozen=True)
class ReplayRequest:
    """``target``: the job to write; steps ``from_step`` to ``to_step`` (default: the last committed);
    ``ranks`` and ``micro_batches`` of the new shape (default: the original's). ``job``: the job whose
    steps are replayed, when it is not the spec's (one written with ``construct --output-job``: its
    sources are the spec's job's)."""

    target: str
    from_step: int
    to_step: int | None = None
    ranks: int | None = None
    micro_batches: int | None = None
    job: str | None = None


@dataclass(frozen=True)
class ReplayPlan:
    """Write steps ``first`` to ``last`` into ``target`` in ``shape``, then, with ``end``, the end of the
    job. ``first`` is past ``from_step`` when an earlier run of the same replay wrote steps already;
    ``done`` when nothing is left to write. ``context_parallel``: a context-parallel job's shape of the
    replay (``shape`` is then its written part): the spec's under the job's own shape, else fitted to the new
    ranks (``replay_cp_shape``)."""

    mode: ReplayMode
    shape: StepShape
    from_step: int
    first: int
    last: int
    end: bool
    done: bool
    start_state: ConstructorState | None
    changes: tuple[MixtureChange, ...]
    context_parallel: CPShape | None = None


def plan_replay(
    request: ReplayRequest,
    original: JobHistory,
    spec_shape: StepShape,
    target: JobHistory | None,
    target_first_step: int | None,
    spec_cp: CPShape | None = None,
) -> ReplayPlan:
    """The plan for ``request``; ``target`` is what the target job holds (None: nothing), and
    ``target_first_step`` the first step on its rank topics; ``spec_cp`` the spec's context-parallel shape
    (``cp_shape_of``; None: the spec has none). Raises ``MixflowError`` naming the input at fault."""
    validate_job_name(request.target)
    if request.target == original.job:
        msg = f"--to-job {request.target} is the job being replayed; give the replay another name"
        raise MixflowError(msg)
    assert original.shape is not None
    last_written = original.steps - 1
    first, last = request.from_step, last_written if request.to_step is None else request.to_step
    if first < 0 or first > last_written:
        msg = f"--from-step {first} is not a step job {original.job} has written (steps 0 to {last_written})"
        raise MixflowError(msg)
    if last < first or last > last_written:
        msg = f"--to-step {last} is not a step from {first} to job {original.job}'s last step, {last_written}"
        raise MixflowError(msg)
    if original.shape.context_parallel:
        shape, cp, mode = _cp_shapes(request, original.job, original.shape, spec_cp)
    else:
        shape, cp = _shape(request, original.shape), None
        mode = ReplayMode.RERUN if shape == original.shape else ReplayMode.REPLAN
    if mode is ReplayMode.RERUN and spec_shape != original.shape:
        msg = (
            f"the spec's step shape ({_describe(spec_shape)}) is not the one job {original.job} wrote "
            f"({_describe(original.shape)}): replay under the spec the job ran with (--ranks and --micro-batches "
            "give the replay another shape)"
        )
        raise MixflowError(msg)
    start = original.before(first)
    if first > 0 and start is None:
        msg = f"job {original.job} has no state record to start step {first} from"
        raise MixflowError(msg)
    end = original.finished and last == last_written
    resume = _resume_at(request, original, shape, target, target_first_step)
    done = resume is None or (resume > last and not end)
    latest = original.last
    return ReplayPlan(
        mode=mode,
        shape=shape,
        from_step=first,
        first=first if resume is None else resume,
        last=last,
        end=end,
        done=done,
        start_state=adopted(start.state) if start is not None else None,
        changes=latest.state.changes if latest is not None else (),
        context_parallel=cp,
    )


def _check_counts(request: ReplayRequest) -> None:
    for name in ("ranks", "micro_batches"):
        value = getattr(request, name)
        if value is not None and value < 1:
            msg = f"--{name.replace('_', '-')} must be at least 1, not {value}"
            raise MixflowError(msg)


def _shape(request: ReplayRequest, original: StepShape) -> StepShape:
    _check_counts(request)
    ranks = request.ranks or original.ranks
    if request.micro_batches is not None:
        micro_batches = request.micro_batches
    elif ranks == original.ranks:
        micro_batches = original.micro_batches
    else:
        micro_batches = default_micro_batches(original.ranks, original.micro_batches, ranks)
    return replace(original, ranks=ranks, micro_batches=micro_batches)


def _cp_shapes(
    request: ReplayRequest, job: str, original: StepShape, spec_cp: CPShape | None
) -> tuple[StepShape, CPShape, ReplayMode]:
    """A context-parallel job's replay: its written shape, its context-parallel shape and its mode. Under the
    job's ranks and the spec's micro-batches the constructor mixes again; otherwise each step is planned again
    over the spec's blocks fitted to the new ranks."""
    mode = original.context_parallel
    if spec_cp is None or spec_cp.mode.value != mode:
        has = "no step.context_parallel" if spec_cp is None else f"step.context_parallel mode {spec_cp.mode.value}"
        msg = (
            f"job {job} plans {mode} context parallelism per sample and the spec has {has}: replay under the spec "
            "the job ran with"
        )
        raise MixflowError(msg)
    _check_counts(request)
    ranks = request.ranks or original.ranks
    if ranks == original.ranks and request.micro_batches in (None, spec_cp.micro_batches):
        return original, spec_cp, ReplayMode.RERUN
    capacity = original.tokens_per_micro_batch
    cp = replay_cp_shape(spec_cp, original.ranks, capacity, ranks, request.micro_batches)
    return replace(original, ranks=ranks), cp, ReplayMode.REPLAN


def _resume_at(
    request: ReplayRequest,
    original: JobHistory,
    shape: StepShape,
    target: JobHistory | None,
    target_first_step: int | None,
) -> int | None:
    """The next step to write into the target: ``from_step`` when it holds nothing, the step after its last
    one when an earlier run of this replay wrote some; None when the target has ended already."""
    if target is None or target.last is None:
        return request.from_step
    name = request.target
    if target.shape is not None and target.shape != shape:
        msg = f"job {name} holds steps of shape {_describe(target.shape)}; this replay writes {_describe(shape)}"
        raise RefusedError(msg)
    if target_first_step is not None and target_first_step != request.from_step:
        msg = (
            f"job {name} holds a replay from step {target_first_step}, not {request.from_step}: give "
            f"--from-step {target_first_step} to continue it, or another --to-job"
        )
        raise RefusedError(msg)
    theirs = target.last.state
    ours = original.final() if theirs.finished else original.before(theirs.step)
    if ours is None or _progress(ours.state) != _progress(theirs):
        msg = (
            f"job {name} is not a replay of {original.job} up to its step {theirs.step - 1}: its state there differs "
            f"from the original's (written by something else, or continued by mixflow construct); give another --to-job"
        )
        raise RefusedError(msg)
    return None if theirs.finished else theirs.step


def _progress(state: ConstructorState) -> tuple[object, ...]:
    """What decides the samples of later steps (not which control records were read)."""
    return (state.mixer, state.positions, state.deferred, state.exhausted, state.finished)


def _describe(shape: StepShape) -> str:
    if shape.context_parallel:
        tokens, mode = shape.tokens_per_micro_batch, shape.context_parallel
        return f"{shape.ranks} ranks of {tokens} tokens a micro-batch, {mode} context parallelism"
    return f"{shape.ranks} ranks x {shape.micro_batches} micro-batches of {shape.tokens_per_micro_batch} tokens"


def adopted(state: ConstructorState) -> ConstructorState:
    """``state`` of the original job as a state of the replayed one: everything that decides the samples
    stays, but its control topic is the replayed job's own, read from its start."""
    return replace(state, control_offset=0, refused=())
