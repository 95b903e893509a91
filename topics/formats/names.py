"""Topic names of a job: ``<job>.src.<source>``, ``<job>.work.<source>``, ``<job>.plan.<source>``,
``<job>.rank.<r>``, ``<job>.state``, ``<job>.control``, ``<job>.dlq`` and ``<job>.progress``.

Job and source names may hold only ``[a-zA-Z0-9_-]``: Kafka's legal topic characters less ``.``, which
is reserved as the separator so that every topic name splits back into its parts without ambiguity
(see ``parse_topic``). Lengths are bounded so that any valid job with any valid source or rank makes a
topic name of at most 249 characters, Kafka's limit.

Kafka refuses a topic whose name equals an existing one once ``.`` is read as ``_`` (their metric
names would collide): job ``a`` with a source ``state`` (``a.src.state``) and job ``a_src``
(``a_src.state``) cannot live on one cluster. Such pairs are refused by the broker, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from topics.errors import InvalidNameError

MAX_TOPIC_LENGTH = 249
"""Kafka's limit on a topic name."""
MAX_SOURCE_LENGTH = 64
"""Longest source name; a source name is also part of sample ids, so it is kept short."""
MAX_JOB_LENGTH = MAX_TOPIC_LENGTH - len(".work.") - MAX_SOURCE_LENGTH
"""Longest job name: leaves room for the longest suffix, ``.work.<source>`` with the longest source."""

_LEGAL = re.compile(r"[a-zA-Z0-9_-]+")
_ILLEGAL_CHAR = re.compile(r"[^a-zA-Z0-9_-]")


class TopicKind(StrEnum):
    """The kinds of topic a job has; the value is the name's middle or last part."""

    SRC = "src"
    WORK = "work"
    PLAN = "plan"
    RANK = "rank"
    STATE = "state"
    CONTROL = "control"
    DLQ = "dlq"
    PROGRESS = "progress"


_PER_SOURCE = (TopicKind.SRC, TopicKind.WORK, TopicKind.PLAN)
_SINGLE = (TopicKind.STATE, TopicKind.CONTROL, TopicKind.DLQ, TopicKind.PROGRESS)


def _validate_part(what: str, name: object, max_length: int) -> str:
    if not isinstance(name, str):
        msg = f"{what} name must be a string, not {type(name).__name__}: {name!r}"
        raise InvalidNameError(msg)
    if not name:
        msg = f"{what} name is empty"
        raise InvalidNameError(msg)
    if not _LEGAL.fullmatch(name):
        bad = sorted(set(_ILLEGAL_CHAR.findall(name)))
        shown = " ".join(repr(c) for c in bad)
        reserved = " ('.' is reserved as the topic name separator)" if "." in bad else ""
        msg = (
            f"{what} name {name!r} holds characters a mixflow topic name cannot: {shown}{reserved}; "
            f"allowed are a-z A-Z 0-9 '_' '-'"
        )
        raise InvalidNameError(msg)
    if len(name) > max_length:
        msg = f"{what} name {name!r} is {len(name)} characters long; at most {max_length} are allowed"
        raise InvalidNameError(msg)
    return name


def validate_job_name(job: object) -> str:
    """Return ``job`` if it is a valid job name, else raise ``InvalidNameError`` naming the problem."""
    return _validate_part("job", job, MAX_JOB_LENGTH)


def validate_source_name(source: object) -> str:
    """Return ``source`` if it is a valid source name, else raise ``InvalidNameError``."""
    return _validate_part("source", source, MAX_SOURCE_LENGTH)


def _validate_rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        msg = f"rank must be a non-negative int, not {rank!r}"
        raise InvalidNameError(msg)
    return rank


@dataclass(frozen=True, slots=True)
class JobTopics:
    """The topic names of one job. ``JobTopics("j").src("web")`` is ``"j.src.web"``."""

    job: str

    def __post_init__(self) -> None:
        validate_job_name(self.job)

    def src(self, source: str) -> str:
        """Samples of one source, published by its loaders (Avro, one partition)."""
        return f"{self.job}.src.{validate_source_name(source)}"

    def work(self, source: str) -> str:
        """Work units of one source, shared by its loaders through a consumer group."""
        return f"{self.job}.work.{validate_source_name(source)}"

    def plan(self, source: str) -> str:
        """The work plan of one source and the measured cost of its units, written by its loaders alone."""
        return f"{self.job}.plan.{validate_source_name(source)}"

    def rank(self, rank: int) -> str:
        """Packed batches for one data-parallel rank (Arrow IPC)."""
        name = f"{self.job}.rank.{_validate_rank(rank)}"
        if len(name) > MAX_TOPIC_LENGTH:
            msg = f"rank {rank} makes topic name {name!r} longer than Kafka's {MAX_TOPIC_LENGTH} characters"
            raise InvalidNameError(msg)
        return name

    @property
    def state(self) -> str:
        """The constructor's per-step state records."""
        return f"{self.job}.state"

    @property
    def control(self) -> str:
        """Changes to a running job, written by the operator and the constructor only: mixture changes, the
        spec in force, epoch requests to the loaders; and the constructors' lease group."""
        return f"{self.job}.control"

    @property
    def dlq(self) -> str:
        """Dead letters: records that could not be turned into samples, with the reason."""
        return f"{self.job}.dlq"

    @property
    def progress(self) -> str:
        """The trainers' progress: the step each rank's sink has handed out, keyed by rank (compacted)."""
        return f"{self.job}.progress"

    @property
    def prefix(self) -> str:
        """Every topic of this job, and no other job's, starts with this."""
        return f"{self.job}."

    def all(self, sources: list[str] | tuple[str, ...], ranks: int) -> list[str]:
        """Every topic of a job with these sources and ``ranks`` data-parallel ranks."""
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            msg = f"ranks must be a positive int, not {ranks!r}"
            raise ValueError(msg)
        names = [self.src(s) for s in sources] + [self.work(s) for s in sources] + [self.plan(s) for s in sources]
        names += [self.rank(r) for r in range(ranks)]
        return [*names, self.state, self.control, self.dlq, self.progress]


@dataclass(frozen=True, slots=True)
class TopicName:
    """A job topic name split into its parts; ``arg`` is the source, the rank, or ``None``."""

    job: str
    kind: TopicKind
    arg: str | int | None = None


def parse_topic(topic: str) -> TopicName:
    """Split a job topic name into its parts, or raise ``InvalidNameError`` if it is not one."""
    parts = topic.split(".") if isinstance(topic, str) else []
    try:
        if len(parts) == 2 and parts[1] in {k.value for k in _SINGLE}:
            return TopicName(validate_job_name(parts[0]), TopicKind(parts[1]))
        if len(parts) == 3 and parts[1] in {k.value for k in _PER_SOURCE}:
            return TopicName(validate_job_name(parts[0]), TopicKind(parts[1]), validate_source_name(parts[2]))
        if len(parts) == 3 and parts[1] == TopicKind.RANK.value and re.fullmatch(r"0|[1-9][0-9]*", parts[2]):
            return TopicName(validate_job_name(parts[0]), TopicKind.RANK, int(parts[2]))
    except InvalidNameError as exc:
        msg = f"{topic!r} is not a mixflow topic name: {exc}"
        raise InvalidNameError(msg) from exc
    msg = (
        f"{topic!r} is not a mixflow topic name; expected <job>.src.<source>, <job>.work.<source>, "
        f"<job>.plan.<source>, <job>.rank.<r>, <job>.state, <job>.control, <job>.dlq or <job>.progress"
    )
    raise InvalidNameError(msg)
