"""Constructor lanes: which lane builds a step, which partition holds it, where a work unit's samples go.

A job of ``C`` lanes runs ``C`` constructors side by side: lane ``j`` builds the steps ``k`` with
``k mod C == j`` from partition ``j`` of every source topic and writes them to partition ``j`` of every
rank topic and of the state topic. A reader therefore finds step ``k`` in partition ``k mod C``. Pure:
no Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def check_lanes(lanes: int) -> int:
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        msg = f"lanes must be a positive int, not {lanes!r}"
        raise ValueError(msg)
    return lanes


def step_lane(step: int, lanes: int) -> int:
    """The lane that builds ``step``, which is also the partition of every rank topic that holds it."""
    check_lanes(lanes)
    if step < 0:
        msg = f"step must be >= 0, not {step}"
        raise ValueError(msg)
    return step % lanes


def first_step_at_or_after(step: int, lane: int, lanes: int) -> int:
    """The first step of ``lane`` that is ``step`` or later."""
    check_lanes(lanes)
    return step + (lane - step) % lanes


def unit_partition(place: int, lanes: int) -> int:
    """The source-topic partition of every sample of a work unit, from the unit's ``place``: its work
    partition plus its offset there, fixed once the unit is committed to the work topic. Any loader, on
    any retry, thus puts a unit in the same partition, a unit's samples stay together and in order, and
    each work partition's consecutive units go round the lanes (so every lane gets about the same share
    of a source, even of a source of few units, which a hash of the unit would not give)."""
    check_lanes(lanes)
    if place < 0:
        msg = f"place must be >= 0, not {place}"
        raise ValueError(msg)
    return place % lanes


@dataclass
class LaneOrder:
    """The order a reader takes a rank topic's partitions in: step ``next_step`` from partition
    ``next_step mod C``. A lane that ended (its end-of-data record says which step it would have built
    next) drops out, and its steps are skipped from there; the stream ends when every lane has ended.

    ``ended`` maps each ended partition to the step in its end-of-data record."""

    lanes: int
    next_step: int = 0
    ended: dict[int, int] = field(default_factory=dict)
    _read: set[int] = field(default_factory=set)  # partitions a batch was read from

    def __post_init__(self) -> None:
        check_lanes(self.lanes)

    @property
    def done(self) -> bool:
        return len(self.ended) == self.lanes

    def partition(self) -> int:
        """The partition the next record is due from (skipping ended lanes); only while not ``done``."""
        if self.done:
            msg = "every lane has ended"
            raise ValueError(msg)
        while self.next_step % self.lanes in self.ended:
            self.next_step += 1
        return self.next_step % self.lanes

    def batch(self, partition: int, step: int) -> str | None:
        """A batch of ``step`` read from ``partition``: None when it is the one due (the order moves on), or
        what is wrong."""
        due = self.partition()
        if partition != due or step != self.next_step:
            return f"step {step} in partition {partition}, where step {self.next_step} of partition {due} was due"
        self.next_step += 1
        self._read.add(partition)
        return None

    def end(self, partition: int, steps: int) -> str | None:
        """The end-of-data record of ``partition``'s lane, saying it would have built step ``steps`` next:
        None when it ends the lane where due, or what is wrong. Before any batch of the partition (a reader
        resumed past the lane's end) it may name an earlier step."""
        due = self.partition()
        early = partition not in self._read and steps % self.lanes == partition and steps < self.next_step
        if partition != due or (steps != self.next_step and not early):
            due_at = f"step {self.next_step} of partition {due}"
            return f"the end of lane {partition} at step {steps}, where {due_at} was due"
        self.ended[partition] = steps
        if not self.done:
            self.partition()
        return None
