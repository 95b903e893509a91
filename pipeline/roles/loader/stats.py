"""What a source loader did: its committed units, samples and tokens, its aborts and rejoins, its time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from connectors import WorkUnit

EPOCHS_KEPT = 16


class UnitCounts(NamedTuple):
    """What one unit produced in its transaction."""

    samples: int = 0
    tokens: int = 0
    dead_letters: int = 0


@dataclass
class LoaderStats:
    units: int = 0
    samples: int = 0
    tokens: int = 0
    dead_letters: int = 0
    aborted: int = 0
    seconds: float = 0.0
    busy_seconds: float = 0.0  # inside transactions: reading, tokenizing, encoding, producing, committing
    rejoins: int = 0  # consumers replaced after the group left this loader without partitions too long
    by_epoch: dict[int, int] = field(default_factory=dict)  # samples of the last EPOCHS_KEPT epochs loaded

    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def unit_committed(self, unit: WorkUnit | None, counts: UnitCounts) -> None:
        """A unit's transaction committed; ``unit`` is None for an undecodable work record."""
        self.units += 1
        self.samples += counts.samples
        self.tokens += counts.tokens
        self.dead_letters += counts.dead_letters
        if unit is not None:
            self.count_epoch(unit.epoch, counts.samples)

    def count_epoch(self, epoch: int, samples: int) -> None:
        """Under ``next_epoch`` a loader runs for ever: only the latest epochs are kept."""
        self.by_epoch[epoch] = self.by_epoch.get(epoch, 0) + samples
        while len(self.by_epoch) > EPOCHS_KEPT:
            del self.by_epoch[min(self.by_epoch)]

    def describe(self) -> str:
        return (
            f"{self.units} units, {self.samples} samples, {self.tokens} tokens "
            f"({self.tokens_per_second():.0f} tokens/s), {self.dead_letters} dead letters, "
            f"{self.aborted} aborted, {self.rejoins} rejoins"
        )
