"""Which spec each stretch of a same-shape replay runs under: the one the job recorded for those steps
(``pipeline.planning.step.spec_in_force``), rebuilt over the spec given. Pure: no Kafka."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.planning.step.spec_in_force import Segment, SpecRecord, changes, digest, mixing_part, segments, spec_for
from pipeline.spec import JobSpec
from topics.errors import MixflowError


@dataclass(frozen=True)
class SpecSegment:
    """Steps ``first`` to ``last``, replayed under ``spec``. ``warning`` when it could not be checked that
    ``spec`` is the one they were written under."""

    first: int
    last: int
    spec: JobSpec
    warning: str | None = None


def replay_specs(job: str, given: JobSpec, records: Sequence[SpecRecord], first: int, last: int) -> list[SpecSegment]:
    """Steps ``first`` to ``last`` of ``job`` cut where the spec recorded for them changes, each stretch with
    the spec to replay it under: ``given`` where its mixing part is the recorded one, or ``given`` with the
    recorded part in force. Steps with no spec recorded (a job written before spec records were kept) are
    replayed under ``given`` with a warning. ``MixflowError`` naming the step and what changed when a
    recorded part cannot be put in force over ``given``."""
    if not records:
        warning = (
            f"job {job} recorded no spec (written before spec records were kept): replaying steps {first} to "
            f"{last} under the spec given, which cannot be checked against the one they were written under"
        )
        return [SpecSegment(first, last, given, warning)]
    own = mixing_part(given)
    out = []
    for segment in segments(records, first, last):
        out.append(_segment(job, given, own, segment))
    return out


def _segment(job: str, given: JobSpec, own: dict[str, object], segment: Segment) -> SpecSegment:
    record = segment.record
    if record is None:
        warning = (
            f"job {job} recorded no spec for steps {segment.first} to {segment.last} (written before spec records "
            "were kept): replaying them under the spec given, unchecked"
        )
        return SpecSegment(segment.first, segment.last, given, warning)
    if record.digest == digest(own):
        return SpecSegment(segment.first, segment.last, given)
    try:
        return SpecSegment(segment.first, segment.last, spec_for(given, record.spec))
    except MixflowError as exc:
        changed = "; ".join(changes(record.spec, own)) or "the spec"
        msg = (
            f"job {job} wrote step {segment.first} under another spec than the one given ({changed} since), "
            f"and that spec cannot be rebuilt over the one given: {exc}. Replay under the spec in force at step "
            f"{segment.first}"
        )
        raise MixflowError(msg) from exc
