"""A hand-over queue between the reading thread and the trainer, bounded in bytes, not in items."""

from __future__ import annotations

import collections
import threading
from typing import Any


class Closed(Exception):
    """The queue was closed while a caller waited on it."""


class ByteBoundedQueue:
    """FIFO whose items together hold at most ``limit_bytes``; one item larger than the limit is still
    admitted when the queue is empty, so a single huge micro-batch cannot wedge the reader."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            msg = f"limit_bytes must be positive, not {limit_bytes!r}"
            raise ValueError(msg)
        self.limit_bytes = limit_bytes
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._used = 0
        self._closed = False
        self._peak = 0
        self._changed = threading.Condition()

    @property
    def peak_bytes(self) -> int:
        """The most bytes it has held at once."""
        return self._peak

    @property
    def used_bytes(self) -> int:
        """The bytes it holds now."""
        return self._used

    def put(self, item: Any, nbytes: int) -> None:
        """Append ``item``, waiting for room; raises ``Closed`` once the queue is closed."""
        with self._changed:
            while self._items and self._used + nbytes > self.limit_bytes and not self._closed:
                self._changed.wait()
            if self._closed:
                raise Closed
            self._items.append((item, nbytes))
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            self._changed.notify_all()

    def get(self) -> Any:
        """The oldest item, waiting for one; raises ``Closed`` once the queue is closed and empty."""
        with self._changed:
            while not self._items and not self._closed:
                self._changed.wait()
            if not self._items:
                raise Closed
            item, nbytes = self._items.popleft()
            self._used -= nbytes
            self._changed.notify_all()
            return item

    def close(self) -> None:
        """Wake every waiter; later puts raise ``Closed``, gets drain what is left, then raise."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
