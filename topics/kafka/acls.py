"""The Kafka ACLs a job's roles need, and no more: computed from the spec, pure (no Kafka client).

Each role runs as the principal of its ``kafka.principals`` entry (``User:<sasl.username>``, or on an mTLS
listener its client certificate's ``User:<CN>``; see ``topics.kafka.settings``). Its bindings allow, on the
job's resources only:

- a source's loader: write ``<job>.src.<source>``, read and write ``<job>.work.<source>`` (the planner
  publishes units there) and ``<job>.plan.<source>`` (its work plan and unit costs), read ``<job>.control``
  (epoch requests) and write ``<job>.dlq``; create only its source's three topics, and describe the configs of
  those and of the control and dead-letter topics it checks; its group ``<job>.loaders.<source>``; its
  transactional ids ``<job>.loader.<source>.<instance>`` (prefixed) and ``<job>.planner.<source>``. A loader
  writes nothing that steers the job: no mixture change, no spec record, no other source's plan;
- the constructor (shadows and replay too): read the source and plan topics, write the rank topics (prefixed
  ``<job>.rank.``; and read them: a constructor that resumes checks the step shape last written), read and
  write ``<job>.state`` and ``<job>.control``, write ``<job>.dlq``, read ``<job>.progress``; the groups and
  transactional ids starting ``<job>.constructor`` (its source offsets, its lease, one per lane) and
  ``<job>.progress-reader``;
- a trainer: read the rank topics (prefixed ``<job>.rank.``), write ``<job>.progress``; with a principal per
  rank (``{rank}`` in its settings: ``topics.kafka.rank_principals``), rank r's reads ``<job>.rank.<r>`` alone
  (literal), for r below the spec's ``step.ranks``;
- an observer (``top``, ``report``, ``autoscale``): read and describe the job's topics and groups;
- the operator (``run``, ``control``, ``topics``, ``chaos``): what an observer may, and write
  ``<job>.control`` (mixture changes), delete the job's topics and groups.

The constructor and the operator, which create the job's topics at start, may create and describe the configs
of topics named ``<job>.``. Every role may describe them (metadata) and describe the groups named
``mixflow-``: its readers that never join a group or commit still give a group id (``mixflow-<what>-<random>``),
and librdkafka looks up its coordinator, which takes DESCRIBE (and allows no commit). Names are prefixed with
``<job>.``, and no job or source name holds a ``.``, so one job's prefixed binding never covers another job's
resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from topics.formats.names import JobTopics
from topics.kafka.authorization import EPHEMERAL_GROUP_PREFIX
from topics.kafka.rank_principals import TRAINER, for_rank, names_rank
from topics.kafka.settings import SOURCE_LOADER_PREFIX, settings_principal


class Resource(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional_id"


class Pattern(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    DESCRIBE = "describe"
    DESCRIBE_CONFIGS = "describe_configs"


_IMPLY_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE})
"""Kafka's implication: each of these allows DESCRIBE of the same resource too."""


@dataclass(frozen=True, order=True)
class Binding:
    """One ALLOW binding, from any host."""

    principal: str
    resource: Resource
    pattern: Pattern
    name: str
    operation: Operation

    def covers(self, principal: str, resource: Resource, name: str, operation: Operation) -> bool:
        """Whether this binding lets ``principal`` do ``operation`` on the resource ``name``."""
        if principal != self.principal or resource != self.resource:
            return False
        if operation != self.operation and not (operation is Operation.DESCRIBE and self.operation in _IMPLY_DESCRIBE):
            return False
        return name == self.name if self.pattern is Pattern.LITERAL else name.startswith(self.name)

    def __str__(self) -> str:
        return f"{self.principal} {self.operation.value} {self.resource.value} {self.pattern.value}:{self.name}"


@dataclass(frozen=True)
class JobNames:
    """What a job's ACLs name: its topic names and the group and transactional-id names its roles use."""

    job: str
    sources: tuple[str, ...]

    @property
    def topics(self) -> JobTopics:
        return JobTopics(self.job)

    @property
    def prefix(self) -> str:
        return f"{self.job}."

    def loader_group(self, source: str) -> str:
        return f"{self.job}.loaders.{source}"

    def loader_transactional_prefix(self, source: str) -> str:
        return f"{self.job}.loader.{source}."

    def planner_transactional_id(self, source: str) -> str:
        return f"{self.job}.planner.{source}"

    @property
    def constructor_prefix(self) -> str:
        """Its transactional ids and groups: ``<job>.constructor``, ``.lane<j>``, and ``.lease`` of each."""
        return f"{self.job}.constructor"

    @property
    def progress_reader_group(self) -> str:
        return f"{self.job}.progress-reader"


def principal_name(settings: Mapping[str, object]) -> str | None:
    """``User:<sasl.username>`` of a principal's settings, else its client certificate's principal (None: it
    names neither)."""
    return settings_principal(settings)


def job_bindings(
    job: str, sources: Sequence[str], principals: Mapping[str, Mapping[str, object]], ranks: int | None = None
) -> dict[str, list[Binding]]:
    """Every binding of a job, by the ``principals`` key (role, or ``loader.<source>``) it is for, sorted.
    Roles without a principal naming a user get none; ``loader`` is for the sources without a
    ``loader.<source>`` of their own. A trainer principal per rank (its settings name ``{rank}``) takes the
    job's ``ranks``: rank r's principal is granted ``<job>.rank.<r>`` alone."""
    names = JobNames(job, tuple(sources))
    out: dict[str, list[Binding]] = {}
    for key, settings in principals.items():
        if key == TRAINER and names_rank(settings):
            if per_rank := _rank_trainers(names, settings, ranks):
                out[key] = per_rank
            continue
        principal = principal_name(settings)
        if principal is None:
            continue
        if key == "loader":
            own = {k.removeprefix(SOURCE_LOADER_PREFIX) for k in principals if k.startswith(SOURCE_LOADER_PREFIX)}
            grants = _loader([s for s in sources if s not in own], names)
        elif key.startswith(SOURCE_LOADER_PREFIX):
            grants = _loader([key.removeprefix(SOURCE_LOADER_PREFIX)], names)
        else:
            grants = _ROLE_GRANTS[key](names)
        out[key] = sorted({Binding(principal, *grant) for grant in grants})
    return out


Grant = tuple[Resource, Pattern, str, Operation]


def _every_role(names: JobNames) -> list[Grant]:
    return [
        (Resource.TOPIC, Pattern.PREFIXED, names.prefix, Operation.DESCRIBE),
        (Resource.GROUP, Pattern.PREFIXED, EPHEMERAL_GROUP_PREFIX, Operation.DESCRIBE),
    ]


def _creates_topics(names: JobNames) -> list[Grant]:
    return [
        (Resource.TOPIC, Pattern.PREFIXED, names.prefix, Operation.CREATE),
        (Resource.TOPIC, Pattern.PREFIXED, names.prefix, Operation.DESCRIBE_CONFIGS),
    ]


def _literal_topics(names: Iterable[str], *operations: Operation) -> list[Grant]:
    return [(Resource.TOPIC, Pattern.LITERAL, name, op) for name in names for op in operations]


def _loader(sources: Sequence[str], names: JobNames) -> list[Grant]:
    if not sources:
        return []
    t = names.topics
    grants = [*_every_role(names)]
    grants += _literal_topics([t.control], Operation.READ, Operation.DESCRIBE_CONFIGS)
    grants += _literal_topics([t.dlq], Operation.WRITE, Operation.DESCRIBE_CONFIGS)
    for source in sources:
        own = [t.src(source), t.work(source), t.plan(source)]
        grants += _literal_topics(own, Operation.CREATE, Operation.DESCRIBE_CONFIGS)
        grants += _literal_topics([t.src(source)], Operation.WRITE)
        grants += _literal_topics([t.work(source), t.plan(source)], Operation.READ, Operation.WRITE)
        grants.append((Resource.GROUP, Pattern.LITERAL, names.loader_group(source), Operation.READ))
        txn = Resource.TRANSACTIONAL_ID
        grants.append((txn, Pattern.PREFIXED, names.loader_transactional_prefix(source), Operation.WRITE))
        grants.append((txn, Pattern.LITERAL, names.planner_transactional_id(source), Operation.WRITE))
    return grants


def _constructor(names: JobNames) -> list[Grant]:
    t = names.topics
    grants = [*_every_role(names), *_creates_topics(names)]
    grants += [
        (Resource.TOPIC, Pattern.PREFIXED, f"{names.job}.src.", Operation.READ),
        (Resource.TOPIC, Pattern.PREFIXED, f"{names.job}.plan.", Operation.READ),  # when a source is done
        (Resource.TOPIC, Pattern.PREFIXED, f"{names.job}.rank.", Operation.WRITE),
        (Resource.TOPIC, Pattern.PREFIXED, f"{names.job}.rank.", Operation.READ),  # the shape it wrote, at start
        (Resource.GROUP, Pattern.PREFIXED, names.prefix, Operation.DESCRIBE),  # the loaders' progress
        (Resource.GROUP, Pattern.PREFIXED, names.constructor_prefix, Operation.READ),
        (Resource.GROUP, Pattern.LITERAL, names.progress_reader_group, Operation.READ),
        (Resource.TRANSACTIONAL_ID, Pattern.PREFIXED, names.constructor_prefix, Operation.WRITE),
    ]
    grants += _literal_topics([t.state, t.control], Operation.READ, Operation.WRITE)
    grants += _literal_topics([t.dlq], Operation.WRITE)
    grants += _literal_topics([t.progress], Operation.READ)
    return grants


def _trainer(names: JobNames) -> list[Grant]:
    return [
        *_every_role(names),
        (Resource.TOPIC, Pattern.PREFIXED, f"{names.job}.rank.", Operation.READ),
        *_literal_topics([names.topics.progress], Operation.WRITE),
    ]


def _rank_trainer(names: JobNames, rank: int) -> list[Grant]:
    return [
        *_every_role(names),
        *_literal_topics([names.topics.rank(rank)], Operation.READ),
        *_literal_topics([names.topics.progress], Operation.WRITE),
    ]


def _rank_trainers(names: JobNames, settings: Mapping[str, object], ranks: int | None) -> list[Binding]:
    """The bindings of a trainer principal per rank: each rank's principal (``{rank}`` replaced in its settings)
    reads its own rank topic only; none when the settings name no user."""
    if ranks is None:
        msg = "the trainers have a principal per rank ({rank}): give the job's ranks"
        raise ValueError(msg)
    out: set[Binding] = set()
    for rank in range(ranks):
        principal = principal_name(for_rank(settings, rank))
        if principal is not None:
            out.update(Binding(principal, *grant) for grant in _rank_trainer(names, rank))
    return sorted(out)


def _observer(names: JobNames) -> list[Grant]:
    return [
        *_every_role(names),
        (Resource.TOPIC, Pattern.PREFIXED, names.prefix, Operation.READ),
        (Resource.GROUP, Pattern.PREFIXED, names.prefix, Operation.DESCRIBE),
    ]


def _operator(names: JobNames) -> list[Grant]:
    return [
        *_observer(names),
        *_creates_topics(names),
        (Resource.TOPIC, Pattern.PREFIXED, names.prefix, Operation.DELETE),
        (Resource.GROUP, Pattern.PREFIXED, names.prefix, Operation.DELETE),
        *_literal_topics([names.topics.control], Operation.WRITE),
    ]


_ROLE_GRANTS = {
    "constructor": _constructor,
    "trainer": _trainer,
    "observer": _observer,
    "operator": _operator,
}


def allowed(bindings: Iterable[Binding], principal: str, resource: Resource, name: str, operation: Operation) -> bool:
    """Whether any of ``bindings`` lets ``principal`` do ``operation`` on ``name``."""
    return any(b.covers(principal, resource, name, operation) for b in bindings)


def all_bindings(by_key: Mapping[str, Sequence[Binding]]) -> list[Binding]:
    """The distinct bindings of ``job_bindings``' answer (two keys may share a principal), sorted."""
    return sorted({b for bindings in by_key.values() for b in bindings})
