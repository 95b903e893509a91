"""``FetchStallWatch``, the pure part: which partition counts as stalled, on made-up events and ends."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from tests.fake_clock import FakeClock
from topics.kafka.fetch_stall import FetchStallWatch

STALL_S = 10.0


class Ends:
    """Where each partition's log ends, as a fresh client would say; None: the brokers are away."""

    def __init__(self) -> None:
        self.high: dict[tuple[str, int], int | None] = {}
        self.asked = 0

    def watermarks(self, partition: TopicPartition, timeout_s: float) -> tuple[int, int]:
        self.asked += 1
        high = self.high.get((partition.topic, partition.partition), 0)
        if high is None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return 0, high


@dataclass
class Event:
    """What a consumer hands on: a record at ``at``, or with ``eof`` the end of the partition at ``at``."""

    at: int
    eof: bool = False
    name: str = "t"
    number: int = 0

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self.eof else None

    def topic(self) -> str:
        return self.name

    def partition(self) -> int:
        return self.number

    def offset(self) -> int:
        return self.at


def watch() -> tuple[FetchStallWatch, FakeClock, Ends]:
    clock, ends = FakeClock(), Ends()
    return FetchStallWatch(ends, STALL_S, clock), clock, ends  # type: ignore[arg-type]


def wait(fetch: FetchStallWatch, clock: FakeClock, seconds: float, step: float = 1.0):
    """Consume for ``seconds`` with nothing arriving; the first stall named, if any."""
    end = clock.now + seconds
    while clock.now < end:
        fetch.consuming()
        if (stall := fetch.stall()) is not None:
            return stall
        clock.now += step
    return None


def test_a_partition_behind_its_end_and_quiet_for_the_stall_time_is_stalled() -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", 0, 5)])
    ends.high[("t", 0)] = 9
    assert not fetch.saw(Event(5))  # a record: reading stands at 6
    stall = wait(fetch, clock, 30)
    assert stall is not None and (stall.topic, stall.partition, stall.reading, stall.end) == ("t", 0, 6, 9)
    assert STALL_S <= stall.quiet_s < STALL_S + 1.5
    assert "stalled at offset 6 although the log ends at 9" in stall.describe()


def test_a_partition_at_its_end_past_markers_is_never_stalled() -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", 0, 0)])
    ends.high[("t", 0)] = 12
    assert not fetch.saw(Event(10))
    assert fetch.saw(Event(12, eof=True))  # a marker at 11: the end event says where reading stands
    assert wait(fetch, clock, 100) is None


def test_paused_partitions_a_busy_caller_and_absent_brokers_are_no_stall() -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", 0, 0)])
    ends.high[("t", 0)] = 5
    fetch.pause([TopicPartition("t", 0)])
    assert wait(fetch, clock, 100) is None and ends.asked == 0
    fetch.resume([TopicPartition("t", 0)])
    assert wait(fetch, clock, STALL_S - 1) is None  # its quiet time starts at the resume
    clock.now += 60  # the caller does other work: nothing was waited for then
    assert wait(fetch, clock, STALL_S - 1) is None
    ends.high[("t", 0)] = None
    assert wait(fetch, clock, 100) is None
    ends.high[("t", 0)] = 5
    assert wait(fetch, clock, STALL_S + 1) is not None


def test_each_partition_is_asked_about_at_most_once_per_stall_time_and_a_restart_starts_again() -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", p, 0) for p in range(3)])
    for p in range(3):
        assert fetch.saw(Event(4, eof=True, number=p))
        ends.high[("t", p)] = 4
    assert wait(fetch, clock, 10 * STALL_S, step=0.5) is None
    assert ends.asked <= 3 * 10
    ends.high[("t", 2)] = 6
    stall = wait(fetch, clock, 2 * STALL_S, step=0.5)
    assert stall is not None and stall.partition == 2
    fetch.restart()
    assert wait(fetch, clock, STALL_S - 1) is None


def test_a_logical_start_offset_counts_as_the_log_start_and_a_dropped_partition_is_not_watched() -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", 0, -2), TopicPartition("u", 0, -1001)])
    ends.high[("t", 0)] = 0
    ends.high[("u", 0)] = 3
    stall = wait(fetch, clock, 30)
    assert stall is not None and (stall.topic, stall.reading) == ("u", 0)
    fetch.assign([TopicPartition("t", 0, 0)])
    assert wait(fetch, clock, 100) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["record", "eof", "grow", "pause", "resume", "idle", "busy"]), st.integers(0, 2)),
        max_size=60,
    )
)
def test_a_stall_is_named_only_for_a_partition_that_is_quiet_unpaused_and_behind(
    events: list[tuple[str, int]],
) -> None:
    fetch, clock, ends = watch()
    fetch.assign([TopicPartition("t", p, 0) for p in range(3)])
    reading, high, paused = [0, 0, 0], [0, 0, 0], set()
    heard = [0.0, 0.0, 0.0]
    for kind, p in events:
        fetch.consuming()
        if kind == "record" and reading[p] < high[p]:
            fetch.saw(Event(reading[p], number=p))
            reading[p] += 1
            heard[p] = clock.now
        elif kind == "eof":
            fetch.saw(Event(high[p], eof=True, number=p))
            reading[p] = high[p]
            heard[p] = clock.now
        elif kind == "grow":
            high[p] += 2
        elif kind == "pause":
            fetch.pause([TopicPartition("t", p)])
            paused.add(p)
        elif kind == "resume" and p in paused:
            fetch.resume([TopicPartition("t", p)])
            paused.discard(p)
            heard[p] = clock.now
        elif kind == "busy":
            clock.now += 5.0  # more than the consuming gap: the quiet times start again
            heard = [clock.now] * 3
            continue
        clock.now += 1.0 if kind != "idle" else 1.5
        for q in range(3):
            ends.high[("t", q)] = high[q]
        if (stall := fetch.stall()) is not None:
            q = stall.partition
            assert q not in paused and stall.reading == reading[q] < high[q] == stall.end
            assert clock.now - heard[q] >= STALL_S
