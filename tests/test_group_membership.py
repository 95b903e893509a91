"""The watch that tells a loader its consumer has been left outside its group (pure, a fake clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.fake_clock import FakeClock
from topics.kafka.group_membership import MembershipWatch

EVENTS = st.lists(
    st.tuples(st.sampled_from(["assigned", "lost", "joining", "wait"]), st.floats(0.0, 30.0)), max_size=40
)


@given(EVENTS, st.floats(1.0, 60.0))
def test_stuck_exactly_when_without_an_assignment_for_the_limit(events: list[tuple[str, float]], limit: float) -> None:
    clock = FakeClock()
    watch = MembershipWatch(limit, clock)
    without_since: float | None = clock.now  # a new consumer waits for its first assignment
    for event, seconds in events:
        if event == "wait":
            clock.now += seconds
        elif event == "assigned":
            watch.assigned()
            without_since = None
        elif event == "lost":
            watch.lost()
            without_since = clock.now if without_since is None else without_since
        else:
            watch.joining()
            without_since = clock.now
        expected = 0.0 if without_since is None else clock.now - without_since
        assert watch.seconds_without() == expected
        assert watch.stuck() == (without_since is not None and expected >= limit)


def test_a_second_loss_does_not_restart_the_count() -> None:
    clock = FakeClock()
    watch = MembershipWatch(10.0, clock)
    watch.assigned()
    watch.lost()
    clock.now += 6
    watch.lost()  # the rejoin's own revoke, say
    clock.now += 5
    assert watch.stuck()
    watch.assigned()
    assert not watch.stuck()
