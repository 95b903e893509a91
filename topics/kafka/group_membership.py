"""Notice a consumer that lost its group membership and never got it back.

librdkafka's classic-protocol consumer can stay outside its group for good after its session lapsed
while the group coordinator was away: seen after a broker restart slower than the session timeout,
when the coordinator answered ``NOT_COORDINATOR`` while it loaded the group (compare
confluentinc/librdkafka#2944 and #3396). Every member of a small group can end up so, and the work
of the group then stops with no error anywhere. The watch below is fed the rebalance callbacks;
when a member has been without an assignment (an empty one counts) for ``rejoin_after_s``, the role
replaces its consumer, which joins as a new member.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_REJOIN_AFTER_S = 45.0
"""Longer than a broker restart plus the session timeout that follows it (the group expires the old
members before it assigns anew): a healthy member hears of its assignment well within it."""


class MembershipWatch:
    """Since when a consumer is without an assignment; ``stuck()`` once that is ``rejoin_after_s``."""

    def __init__(self, rejoin_after_s: float = DEFAULT_REJOIN_AFTER_S, clock: Callable[[], float] = time.monotonic):
        self.rejoin_after_s = rejoin_after_s
        self._clock = clock
        self._without_since: float | None = clock()  # subscribed, waiting for the first assignment

    def joining(self) -> None:
        """A new consumer subscribed: it has no assignment yet."""
        self._without_since = self._clock()

    def assigned(self) -> None:
        self._without_since = None

    def lost(self) -> None:
        """A revoke or a lost assignment: the member rejoins and should be assigned again soon."""
        if self._without_since is None:
            self._without_since = self._clock()

    def seconds_without(self) -> float:
        return 0.0 if self._without_since is None else self._clock() - self._without_since

    def stuck(self) -> bool:
        return self._without_since is not None and self.seconds_without() >= self.rejoin_after_s
