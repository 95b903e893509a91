"""Dead letters by source and reason, against each source's records: what `mixflow run`'s report states, what
its verdict holds to ``--allow-dead-letters``, and what `mixflow top` lists. Pure: the callers read the topics.

Reasons are grouped by their kind: the reason with its numbers taken out (``image needs 70 tokens, more than
max_sample_length 64`` and ``... 90 tokens ...`` are one kind), shown by the first reason of the kind met. A
source's records are the documents its loaders read, one per epoch: those that became samples and those that
became dead letters. The share a source lost is counted in records, not letters: a letter that stands for a whole
work unit (a file that does not open, an object changed since planning) counts the records the unit held
(``DeadLetter.records``; where the plan did not count them, ``pipeline.tools.delivery`` estimates them)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_ALLOWED_SHARE = 0.01
"""The share of a source's records that may become dead letters before a run's verdict is no."""
REASONS_SHOWN = 3
"""Reason kinds named per source; the others are counted together."""
_NUMBER = re.compile(r"\d+")


def reason_kind(reason: str) -> str:
    """``reason`` with every number as ``#``: the key its kind is counted under."""
    return _NUMBER.sub("#", reason)


@dataclass(frozen=True)
class ReasonCount:
    reason: str  # the first reason of its kind met
    letters: int
    kinds: int = 1  # more than 1 for the row that counts the reasons not shown together
    lost: int | None = None  # the records those letters stand for (None: one each)

    @property
    def records(self) -> int:
        return self.letters if self.lost is None else self.lost

    def describe(self) -> str:
        """``7 x changed since planning (3282 records)``, or ``12 x not UTF-8`` for letters of one record each."""
        counted = f" ({self.records} records)" if self.records != self.letters else ""
        return f"{self.letters} x {self.reason}{counted}"


@dataclass(frozen=True)
class SourceLetters:
    """One source's dead letters: ``letters`` standing for ``lost`` of its ``records``, by reason kind, the kinds
    that lost the most records first."""

    source: str
    letters: int
    records: int
    reasons: tuple[ReasonCount, ...]
    lost: int | None = None  # the records the letters stand for (None: one each)

    @property
    def lost_records(self) -> int:
        return self.letters if self.lost is None else self.lost

    @property
    def share(self) -> float:
        """Of its records, those lost to dead letters (records not known: all of them)."""
        lost = self.lost_records
        return lost / max(self.records, lost) if lost else 0.0

    def shown(self, limit: int = REASONS_SHOWN) -> list[ReasonCount]:
        """The ``limit`` kinds that lost the most, then one row counting every other kind, so none is left
        unsaid."""
        if len(self.reasons) <= limit:
            return list(self.reasons)
        rest = self.reasons[limit:]
        lost = sum(r.records for r in rest)
        other = ReasonCount(f"({len(rest)} other reasons)", sum(r.letters for r in rest), len(rest), lost)
        return [*self.reasons[:limit], other]

    def summary(self) -> str:
        """``interleaved 12 of 40 records (30.0%)``, and ``in 3 dead letters`` when they stand for more."""
        letters = f" in {self.letters} dead letters" if self.lost_records != self.letters else ""
        return f"{self.source} {self.lost_records} of {self.records} records ({self.share:.1%}){letters}"

    def top_reasons(self, limit: int = REASONS_SHOWN) -> str:
        return "; ".join(r.describe() for r in self.shown(limit))


def tally(
    letters: Mapping[tuple[str, str], int],
    records: Mapping[str, int] | None = None,
    lost: Mapping[tuple[str, str], int] | None = None,
) -> list[SourceLetters]:
    """Per source, the dead letters counted by ``(source, reason)`` in ``letters``, by kind, with the records
    they stand for in ``lost`` (by default one each); ``records`` (by source) is each source's records, every
    source named there listed even without a dead letter, in its order; the others after, by name."""
    records = records or {}
    lost = letters if lost is None else lost
    by_kind: dict[str, Counter[str]] = {}
    lost_by_kind: dict[str, Counter[str]] = {}
    first: dict[tuple[str, str], str] = {}
    for (source, reason), count in letters.items():
        kind = reason_kind(reason)
        by_kind.setdefault(source, Counter())[kind] += count
        lost_by_kind.setdefault(source, Counter())[kind] += lost.get((source, reason), count)
        first.setdefault((source, kind), reason)
    names = [*records, *sorted(by_kind.keys() - records.keys())]
    out = []
    for source in names:
        kinds, gone = by_kind.get(source, Counter()), lost_by_kind.get(source, Counter())
        ordered = sorted(kinds, key=lambda kind: (-gone[kind], -kinds[kind], kind))
        reasons = tuple(ReasonCount(first[(source, k)], kinds[k], lost=gone[k]) for k in ordered)
        out.append(SourceLetters(source, sum(kinds.values()), records.get(source, 0), reasons, sum(gone.values())))
    return out


def over_share(tallies: Iterable[SourceLetters], allowed: float) -> list[SourceLetters]:
    """The sources that lost more than ``allowed`` of their records to dead letters."""
    return [t for t in tallies if t.letters and t.share > allowed]


def report_lines(tallies: list[SourceLetters], allowed: float) -> list[str]:
    """The run report's dead-letter lines: the records lost per source, each source's reasons, then the verdict."""
    letters = sum(t.letters for t in tallies)
    if not letters:
        return ["dead letters: none"]
    records, lost = sum(t.records for t in tallies), sum(t.lost_records for t in tallies)
    counted = f"{letters} for {lost}" if lost != letters else f"{letters}"
    lines = [f"dead letters: {counted} of {records} records: " + ", ".join(t.summary() for t in tallies)]
    for t in tallies:
        lines += [f"  {t.source}: {r.describe()}" for r in t.shown()]
    lines.append(verdict_line(tallies, allowed))
    return lines


def verdict_line(tallies: list[SourceLetters], allowed: float) -> str:
    lossy = over_share(tallies, allowed)
    if not lossy:
        return f"each source lost at most {allowed:.1%} of its records to dead letters: yes"
    worst = "; ".join(f"source {t.summary()}: {t.top_reasons()}" for t in lossy)
    return (
        f"each source lost at most {allowed:.1%} of its records to dead letters: NO ({worst}); "
        "--allow-dead-letters SHARE allows more"
    )
