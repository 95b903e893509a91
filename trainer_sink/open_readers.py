"""Readers a trainer left open, closed before the interpreter finalizes.

A framework that stops iterating at ``max_steps`` may never close the sink's iterator; its reading thread, a
daemon, is then stopped by the interpreter's finalization wherever it is, and one stopped inside torch aborts
the process ("terminate called without an active exception"). Exit handlers run before that."""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


open_readers: weakref.WeakSet[Closable] = weakref.WeakSet()


@atexit.register
def _close_open_readers() -> None:
    for reader in list(open_readers):
        reader.close()
