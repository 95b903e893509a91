"""The fault proxy (``pipeline/tools/stack/fault_proxy.py``): its pure core over families of faults and moments,
and its shell in front of the real local object store, where a boto3 client sees the latency time it out, the
refused connections retried until the faults end, and open connections reset."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline.tools.stack.fault_proxy import Action, FaultProxy, Faults
from tests.object_store import ObjectStoreEndpoint

WAIT_S = 60.0
seconds = st.floats(0, 1e4, allow_nan=False)


@given(latency=seconds, refuse=st.booleans(), until=st.none() | seconds, now=seconds)
@example(latency=513.0, refuse=False, until=514.4174402315604, now=1.4935945139999944)  # until - now rounds up
def test_faults_hold_chunks_at_most_their_latency_and_never_past_their_end(
    latency: float, refuse: bool, until: float | None, now: float
) -> None:
    faults = Faults(latency, refuse, until)
    active = until is None or now < until
    assert faults.active(now) is active
    assert faults.on_connect(now) is (Action.RESET if refuse and active else Action.FORWARD)
    delay = faults.delay_s(now)
    assert 0 <= delay <= latency
    if until is not None:
        assert now + delay <= max(now, until)
    if not active:
        assert delay == 0


@given(latency=seconds, duration=st.floats(0, 100), now=seconds)
def test_lasting_faults_end_by_themselves(latency: float, duration: float, now: float) -> None:
    faults = Faults(latency, refuse=True).lasting(duration, now)
    assert faults.on_connect(now + duration) is Action.FORWARD and faults.delay_s(now + duration) == 0


def test_a_negative_latency_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        Faults(latency_s=-1)


@pytest.fixture
def proxy(object_store_proxy: tuple[FaultProxy, ObjectStoreEndpoint]) -> FaultProxy:
    return object_store_proxy[0]


def _client(object_store: ObjectStoreEndpoint, proxy: FaultProxy, **config: Any) -> Any:
    return object_store.through(proxy.endpoint).client(**config)


def test_objects_pass_through_unchanged(object_store: ObjectStoreEndpoint, proxy: FaultProxy) -> None:
    body = bytes(range(256)) * 1024  # several chunks each way
    client = _client(object_store, proxy)
    bucket = object_store.bucket("through-proxy")
    client.put_object(Bucket=bucket, Key="k", Body=body)
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == body
    assert client.get_object(Bucket=bucket, Key="k", Range="bytes=1000-1999")["Body"].read() == body[1000:2000]


def test_latency_times_a_request_out_until_cleared(object_store: ObjectStoreEndpoint, proxy: FaultProxy) -> None:
    bucket = object_store.bucket("slow")
    object_store.client().put_object(Bucket=bucket, Key="k", Body=b"slow")
    client = _client(object_store, proxy, retries={"total_max_attempts": 1}, read_timeout=1, connect_timeout=1)
    proxy.set_faults(Faults(latency_s=3.0))
    with pytest.raises(ReadTimeoutError):
        client.get_object(Bucket=bucket, Key="k")
    proxy.clear()
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"slow"


def test_a_client_retries_refused_connections_until_the_faults_end(
    object_store: ObjectStoreEndpoint, proxy: FaultProxy
) -> None:
    bucket = object_store.bucket("refused")
    object_store.client().put_object(Bucket=bucket, Key="k", Body=b"after the refusals")
    client = _client(object_store, proxy, retries={"mode": "standard", "total_max_attempts": 30})
    proxy.set_faults(Faults(refuse=True).lasting(2.0, time.monotonic()))
    got = client.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"after the refusals"
    assert got["ResponseMetadata"]["RetryAttempts"] >= 1 and proxy.refused >= 1


def test_refused_until_cleared_then_the_retried_request_succeeds(
    object_store: ObjectStoreEndpoint, proxy: FaultProxy
) -> None:
    bucket = object_store.bucket("refused-cleared")
    object_store.client().put_object(Bucket=bucket, Key="k", Body=b"cleared")
    client = _client(object_store, proxy, retries={"mode": "standard", "total_max_attempts": 30})
    failed = threading.Event()
    client.meta.events.register(
        "needs-retry.s3.GetObject", lambda caught_exception=None, **_: caught_exception and failed.set()
    )
    proxy.set_faults(Faults(refuse=True))
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(got=client.get_object(Bucket=bucket, Key="k")))
    thread.start()
    assert failed.wait(WAIT_S), "the client never saw a refused connection"
    proxy.clear()
    thread.join(WAIT_S)
    assert outcome["got"]["Body"].read() == b"cleared"


def test_open_connections_are_reset(proxy: FaultProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # an unfinished request: the connection stays open
        deadline = time.monotonic() + WAIT_S
        while not proxy.reset_connections():
            assert time.monotonic() < deadline, "the proxy never held the connection"
        with pytest.raises(ConnectionResetError):
            while conn.recv(1024):
                pass
            raise AssertionError("the connection was closed, not reset")
