"""Scoring a step's options on several threads: each score is a plan whose kernels run without the GIL, so
while ``choose_option`` waits for option ``i``, the next ones are planned on other cores. The options it asks for
are still asked for in order and its choice depends on their scores alone, so the choice is the one scoring them
one by one makes; an option planned ahead that it never asks for is work thrown away."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache

PLANNING_THREADS = max(1, min(8, (os.cpu_count() or 1) - 1))
"""Options planned at once: the cores but one (which decodes and writes records), at most 8; 1 on two cores."""


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="plan-option")


class SpeculativeScores:
    """``score_of`` of ``count`` options as a callable that, asked for option ``i``, starts options ``i`` to
    ``i + threads - 1`` not started yet and waits for ``i``. ``close`` cancels what has not begun."""

    def __init__(self, score_of: Callable[[int], float], count: int, threads: int = PLANNING_THREADS) -> None:
        self.score_of = score_of
        self.count = count
        self.threads = threads
        self.started: dict[int, Future[float]] = {}

    def __call__(self, i: int) -> float:
        if self.threads <= 1:
            return self.score_of(i)
        for j in range(i, min(i + self.threads, self.count)):
            if j not in self.started:
                self.started[j] = _pool(self.threads).submit(self.score_of, j)
        return self.started[i].result()

    def close(self) -> None:
        for started in self.started.values():
            started.cancel()
