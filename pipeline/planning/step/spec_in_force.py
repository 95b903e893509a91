"""The spec in force at each step of a job: the part of the spec that decides the bytes of its steps, as the
constructor records it when it starts or resumes under a spec whose part differs from the last recorded
one (``pipeline.kafka.spec_record``). Pure: no Kafka.

A replay under the job's step shape rebuilds each stretch of steps under the spec recorded for it, so
that it writes the original's bytes across a resume under a changed spec (:func:`segments`,
:func:`spec_for`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import NonNegativeInt, ValidationError

from pipeline.spec import JobSpec
from topics.errors import MixflowError
from topics.formats.json_record import json_record

SECTIONS = ("mixture", "step", "cost", "composition", "long_context", "seed", "on_exhausted")
"""The spec's top-level sections that decide what the constructor writes, besides its sources."""
SOURCE_FIELDS = ("name", "max_sample_length")
"""What of a source decides the steps: its name (and place in the list), and how long its samples can be
(long-context sources are those that can reach ``long_context.min_length``)."""


def mixing_part(spec: JobSpec) -> dict[str, Any]:
    """The part of ``spec`` that decides the bytes of the steps, as JSON values."""
    body = spec.model_dump(mode="json", include={"sources", *SECTIONS})
    body["sources"] = [{name: source[name] for name in SOURCE_FIELDS} for source in body["sources"]]
    return {name: body[name] for name in ("sources", *SECTIONS)}


def digest(part: dict[str, Any]) -> str:
    """A canonical digest of a mixing part: equal parts, equal digests."""
    canonical = json.dumps(part, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@json_record("spec record")
@dataclass(frozen=True)
class SpecRecord:
    """From step ``from_step`` on, the job's steps are written under a spec whose mixing part is ``spec``
    (its ``digest``). On ``<job>.control`` with key ``spec``:
    ``{"kind": "spec", "from_step": 10, "digest": "...", "spec": {"sources": [...], "mixture": ...}}``."""

    from_step: NonNegativeInt
    digest: str
    spec: dict[str, Any]

    @classmethod
    def of(cls, spec: JobSpec, from_step: int) -> SpecRecord:
        part = mixing_part(spec)
        return cls(from_step, digest(part), part)


def in_force(records: Sequence[SpecRecord]) -> list[SpecRecord]:
    """The records that hold, by step: each record (in the order written) holds from its ``from_step`` on
    and replaces the earlier ones from there (a constructor that resumed at a step before a later record's,
    after that record was written but before its steps committed, wrote the steps from there)."""
    held: list[SpecRecord] = []
    for record in records:
        held = [r for r in held if r.from_step < record.from_step]
        if not held or held[-1].digest != record.digest:
            held.append(record)
    return held


@dataclass(frozen=True)
class Segment:
    """Steps ``first`` to ``last`` of a job, written under the mixing part ``record`` (None: unknown, the
    job had recorded no spec for them)."""

    first: int
    last: int
    record: SpecRecord | None


def segments(records: Sequence[SpecRecord], first: int, last: int) -> list[Segment]:
    """Steps ``first`` to ``last`` cut where the spec in force changes."""
    held = in_force(records)
    cuts = [r.from_step for r in held if first < r.from_step <= last]
    starts = [first, *cuts]
    ends = [s - 1 for s in cuts] + [last]
    out = []
    for start, end in zip(starts, ends, strict=True):
        record = next((r for r in reversed(held) if r.from_step <= start), None)
        out.append(Segment(start, end, record))
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs from the mixing part ``before`` to ``after``, in words: sources added or removed, and
    each other section that changed."""
    out = []
    old = [s["name"] for s in before.get("sources", [])]
    new = [s["name"] for s in after.get("sources", [])]
    if added := [s for s in new if s not in old]:
        out.append(f"sources added: {', '.join(added)}")
    if removed := [s for s in old if s not in new]:
        out.append(f"sources removed: {', '.join(removed)}")
    kept_old = [s for s in before.get("sources", []) if s["name"] in new]
    kept_new = [s for s in after.get("sources", []) if s["name"] in old]
    if [s["name"] for s in kept_old] != [s["name"] for s in kept_new]:
        out.append("the sources' order")
    elif kept_old != kept_new:
        out.append("sources' max_sample_length")
    for name in SECTIONS:
        _differences(name, before.get(name), after.get(name), out)
    return out


def _differences(path: str, before: Any, after: Any, out: list[str]) -> None:
    """``path before -> after`` for each leaf that differs, e.g. ``mixture.weights.d null -> 1.0``."""
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in [*before, *(k for k in after if k not in before)]:
            _differences(f"{path}.{key}", before.get(key), after.get(key), out)
        return
    out.append(f"{path} {_short(before)} -> {_short(after)}")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."


def spec_for(base: JobSpec, part: dict[str, Any]) -> JobSpec:
    """``base`` (the spec given: Kafka, paths, tokenizers) with the mixing part ``part`` in force instead of
    its own. A source ``base`` no longer has is taken as a copy of its first source under that name: the
    constructor reads a source's topic by name, and nothing else of it but what ``part`` holds.
    ``MixflowError`` when the result is not a valid spec."""
    body = base.model_dump(mode="json")
    by_name = {s["name"]: s for s in body["sources"]}
    sources = []
    for source in part["sources"]:
        known = dict(by_name.get(source["name"], body["sources"][0]))
        sources.append({**known, **source})
    body.update({name: part[name] for name in SECTIONS}, sources=sources)
    try:
        return JobSpec.model_validate(body)
    except ValidationError as exc:
        msg = f"the spec recorded for job {base.job} cannot be rebuilt over the spec given: {exc}"
        raise MixflowError(msg) from exc
