"""A clock that moves only when the test says: for the watches that take ``clock=`` (pure tests)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
