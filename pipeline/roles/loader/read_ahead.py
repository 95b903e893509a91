"""Reading the next units of an object-store source while the loader tokenizes the current one.

A unit of a small object costs a loader one request to the store, which on a local disk is a read of a few
microseconds: a source of many small objects would load at the pace of the store's answers. So while a
transaction takes the units already fetched after its first, ``ReadAhead`` reads up to ``READ_AHEAD_UNITS`` of
them at once, each held whole (documents and dead letters, in order) until the loader comes to it. Only units of
at most ``READ_AHEAD_MAX_BYTES`` are read ahead, so what is held stays bounded; a local source reads nothing
ahead (its reads do not wait on anything)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from connectors import Document, WorkUnit
from connectors.readers import Reader
from topics.formats.dead_letter import DeadLetter

READ_AHEAD_UNITS = 8
"""Units a loader reads ahead of the one it tokenizes, from an object store."""
READ_AHEAD_MAX_BYTES = 1 << 20
"""Only a unit of at most this many bytes (its planned estimate) is read ahead."""

Items = list[Document | DeadLetter]


class ReadAhead:
    """The units ``start``ed, read on ``units`` threads; ``items`` hands each one's documents over in order."""

    def __init__(self, reader: Reader, units: int = READ_AHEAD_UNITS) -> None:
        self.reader = reader
        self.units = units if reader.storage.remote else 0
        self._pool = ThreadPoolExecutor(self.units, thread_name_prefix="read-ahead") if self.units else None
        self._reading: dict[str, Future[Items]] = {}

    def start(self, unit: WorkUnit) -> None:
        """Begin reading ``unit`` if it is read ahead."""
        if self._pool is None or unit.estimated_bytes > READ_AHEAD_MAX_BYTES or unit.unit_id in self._reading:
            return
        self._reading[unit.unit_id] = self._pool.submit(lambda: list(self.reader.read(unit)))

    def items(self, unit: WorkUnit) -> Iterator[Document | DeadLetter]:
        """``unit``'s documents and dead letters: those read ahead (an error reading it raised here, as a read of
        it now would raise it), or else read now."""
        reading = self._reading.pop(unit.unit_id, None)
        if reading is None:
            return self.reader.read(unit)
        return iter(reading.result())

    def forget(self) -> None:
        """Drop what was read ahead and not handed over (a transaction that ended early: its units are read
        again when they come back)."""
        for reading in self._reading.values():
            reading.cancel()
        self._reading.clear()

    def close(self) -> None:
        self.forget()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
