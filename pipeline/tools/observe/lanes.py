"""What the last state record of each constructor lane says about a job as a whole. Lane ``j`` of ``C``
writes the steps ``k`` with ``k mod C == j`` and consumes partition ``j`` of every source topic; its
state record's ``step`` is the next step it builds (its last written plus ``C``). Pure: no Kafka."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.planning.mixing import MixtureChange
from pipeline.planning.step.state import ConstructorState


@dataclass(frozen=True)
class LaneStates:
    """``states`` maps each lane that has committed a state record to its last one."""

    lanes: int
    states: Mapping[int, ConstructorState]

    @property
    def started(self) -> bool:
        return bool(self.states)

    @property
    def next_step(self) -> int:
        """One past the highest step any lane has written: the steps written, where no lane lags."""
        return max([0, *(s.step - self.lanes + 1 for s in self.states.values())])

    @property
    def finished(self) -> bool:
        """Every lane has written its last step."""
        return len(self.states) == self.lanes and all(s.finished for s in self.states.values())

    @property
    def changes(self) -> tuple[MixtureChange, ...]:
        """The mixture changes accepted, from the lane that has read the most of the control topic."""
        if not self.states:
            return ()
        furthest = max(self.states.values(), key=lambda s: (s.control_offset, len(s.changes), s.step))
        return furthest.changes

    def delivered(self, source: str, ends: Mapping[int, int]) -> int | None:
        """Offsets of ``source``'s partitions (``ends``: partition -> end) that their lanes' state records
        say are delivered, each at most its partition's end; None when no lane has a position there."""
        positions = {p: s.positions[source] for p, s in self.states.items() if source in s.positions}
        if not positions:
            return None
        return sum(min(end, positions[p].low + len(positions[p].used)) for p, end in ends.items() if p in positions)
