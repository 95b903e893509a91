"""Dead letters by source and reason, against each source's records: what `mixflow run`'s report states, what
its verdict holds to ``--allow-dead-letters``, and what `mixflow top` lists. Pure: the callers read the topics.

Reasons are grouped by their kind: the reason with its numbers taken out (``image needs 70 tokens, more than
max_sample_length 64`` and ``... 90 tokens ...`` are one kind), shown by the first reason of the kind met. A
source's records are the documents its loaders read, one per epoch: those that became samples and those that
became dead letters (a file that cannot be opened at all counts as one)."""

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


@dataclass(frozen=True)
class SourceLetters:
    """One source's dead letters: ``letters`` of its ``records``, by reason kind, the most frequent first."""

    source: str
    letters: int
    records: int
    reasons: tuple[ReasonCount, ...]

    @property
    def share(self) -> float:
        """Of its records, those that became dead letters (records not known: all of them)."""
        return self.letters / max(self.records, self.letters) if self.letters else 0.0

    def shown(self, limit: int = REASONS_SHOWN) -> list[ReasonCount]:
        """The ``limit`` most frequent kinds, then one row counting every other kind, so none is left unsaid."""
        if len(self.reasons) <= limit:
            return list(self.reasons)
        rest = self.reasons[limit:]
        other = ReasonCount(f"({len(rest)} other reasons)", sum(r.letters for r in rest), len(rest))
        return [*self.reasons[:limit], other]

    def summary(self) -> str:
        """``interleaved 12 of 40 records (30.0%)``."""
        return f"{self.source} {self.letters} of {self.records} records ({self.share:.1%})"

    def top_reasons(self, limit: int = REASONS_SHOWN) -> str:
        return "; ".join(f"{r.letters} x {r.reason}" for r in self.shown(limit))


def tally(letters: Mapping[tuple[str, str], int], records: Mapping[str, int] | None = None) -> list[SourceLetters]:
    """Per source, the dead letters counted by ``(source, reason)`` in ``letters``, by kind; ``records`` (by
    source) is each source's records, every source named there listed even without a dead letter, in its order;
    the others after, by name."""
    records = records or {}
    by_kind: dict[str, Counter[str]] = {}
    first: dict[tuple[str, str], str] = {}
    for (source, reason), count in letters.items():
        kind = reason_kind(reason)
        by_kind.setdefault(source, Counter())[kind] += count
        first.setdefault((source, kind), reason)
    names = [*records, *sorted(by_kind.keys() - records.keys())]
    out = []
    for source in names:
        kinds = by_kind.get(source, Counter())
        ordered = sorted(kinds.items(), key=lambda item: (-item[1], item[0]))
        reasons = tuple(ReasonCount(first[(source, kind)], n) for kind, n in ordered)
        out.append(SourceLetters(source, sum(kinds.values()), records.get(source, 0), reasons))
    return out


def over_share(tallies: Iterable[SourceLetters], allowed: float) -> list[SourceLetters]:
    """The sources that lost more than ``allowed`` of their records to dead letters."""
    return [t for t in tallies if t.letters and t.share > allowed]


def report_lines(tallies: list[SourceLetters], allowed: float) -> list[str]:
    """The run report's dead-letter lines: the count per source, each source's reasons, then the verdict."""
    letters = sum(t.letters for t in tallies)
    if not letters:
        return ["dead letters: none"]
    records = sum(t.records for t in tallies)
    lines = [f"dead letters: {letters} of {records} records: " + ", ".join(t.summary() for t in tallies)]
    for t in tallies:
        lines += [f"  {t.source}: {r.letters} x {r.reason}" for r in t.shown()]
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
