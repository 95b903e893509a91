"""A TCP proxy that makes a server slow, or refuses and resets its connections, on demand: storage faults
for tests and chaos runs, in front of the local object store (or any TCP server).

``Faults`` is the pure core: what the proxy does to a new connection (forward it or reset it) and how
long it holds each chunk it relays, at a given moment; faults may end by themselves (``until``).
``FaultProxy`` is the shell: an asyncio server on a thread of its own, which relays bytes both ways and
asks the current ``Faults`` at every connection and chunk. ``reset_connections()`` resets the open ones
(the client sees ``ECONNRESET``, as when a server or a load balancer drops it)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
import threading
import time
from dataclasses import dataclass, replace
from enum import StrEnum

CHUNK = 64 * 1024


class Action(StrEnum):
    FORWARD = "forward"
    RESET = "reset"


@dataclass(frozen=True)
class Faults:
    """What the proxy does now: ``latency_s`` before each chunk relayed (either way), ``refuse`` new
    connections (reset at once), until the monotonic time ``until`` (None: until changed)."""

    latency_s: float = 0.0
    refuse: bool = False
    until: float | None = None

    def __post_init__(self) -> None:
        if not self.latency_s >= 0:
            msg = f"latency_s must be at least 0, not {self.latency_s}"
            raise ValueError(msg)

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until

    def on_connect(self, now: float) -> Action:
        return Action.RESET if self.refuse and self.active(now) else Action.FORWARD

    def delay_s(self, now: float) -> float:
        """How long to hold a chunk that arrives at ``now``: the latency while active, and never past
        ``until`` (a chunk held across the end goes out when the faults end)."""
        if not self.active(now):
            return 0.0
        if self.until is None:
            return self.latency_s
        delay = min(self.latency_s, self.until - now)
        while delay > 0.0 and now + delay > self.until:  # ``until - now`` rounded up: back off by an ulp
            delay = math.nextafter(delay, 0.0)
        return delay

    def lasting(self, seconds: float, now: float) -> Faults:
        """These faults, ending ``seconds`` after ``now``."""
        return replace(self, until=now + seconds)


NONE = Faults()


class FaultProxy:
    """Relay ``listen_host:listen_port`` (0: a free port) to ``target_host:target_port`` under ``faults``."""

    def __init__(
        self, target_host: str, target_port: int, listen_host: str = "127.0.0.1", listen_port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.listen = (listen_host, listen_port)
        self.faults = NONE
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self.connections = 0  # accepted, refused ones included
        self.refused = 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.listen[0]}:{self.port}"

    def start(self) -> FaultProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if self._server is None:
            msg = f"the fault proxy could not listen on {self.listen[0]}:{self.listen[1]}"
            raise OSError(msg)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults  # read by the loop's thread at each connection and chunk

    def clear(self) -> None:
        self.faults = NONE

    def reset_connections(self) -> int:
        """Reset every open connection (both sides); how many there were."""
        assert self._loop is not None, "the proxy is not running"
        return asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(timeout=10)

    # -- the loop's thread ----------------------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, *self.listen))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError:
            self._server = None
        finally:
            ready.set()
        if self._server is not None:
            self._loop.run_forever()
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()

    async def _reset_all(self) -> int:
        writers = list(self._writers)
        for writer in writers:
            _reset(writer)
        return len(writers)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.faults.on_connect(time.monotonic()) is Action.RESET:
            self.refused += 1
            _reset(client_writer)
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(client_writer)  # the server is down: the client sees it as refused
            return
        self._writers.update((client_writer, server_writer))
        try:
            await asyncio.gather(
                self._relay(client_reader, server_writer, client_writer),
                self._relay(server_reader, client_writer, server_writer),
            )
        finally:
            for writer in (client_writer, server_writer):
                self._writers.discard(writer)
                writer.close()

    async def _relay(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reader_side: asyncio.StreamWriter
    ) -> None:
        """Copy ``reader`` to ``writer`` until end of stream (passed on as a half-close); when either side
        fails, reset both, so that the relay the other way ends too."""
        try:
            while chunk := await reader.read(CHUNK):
                if (delay := self.faults.delay_s(time.monotonic())) > 0:
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:  # ConnectionResetError, BrokenPipeError and the like
            _reset(writer)
            _reset(reader_side)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST instead of a FIN: SO_LINGER on, with a timeout of 0."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
