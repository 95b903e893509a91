"""The object store of a chaos run and its faults: a running local object store (``LocalObjectStore``) that the
job's ``s3://`` sources read, reached by the roles through a ``FaultProxy`` of the run.

The roles get the proxy's endpoint (``AWS_ENDPOINT_URL``) and the store's keys (``AWS_ACCESS_KEY_ID``, ...), and
the run's specs name the proxy wherever the original names the store's endpoint. Then a fault is one of:
restart the store (stop, down a while, start), stall it (SIGSTOP, then SIGCONT), slow it (the proxy holds
every chunk a while), or refuse it (the proxy resets open connections and new ones) for a while.

With ``user``, the roles read with the keys of a user the run adds to the store (random, for this run only)
rather than the store's root keys, and the run's specs name those keys (``{env: AWS_ACCESS_KEY_ID}``, ...) in
place of any credentials the original names: ``remove_user`` revokes the key a while, ``add_user`` gives it
back (``revoke-storage-key``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.tools.chaos.schedule import Fault, FaultKind
from pipeline.tools.stack.fault_proxy import FaultProxy, Faults
from pipeline.tools.stack.object_store import Credentials, LocalObjectStore, ObjectStoreStopped, new_credentials
from topics.errors import MixflowError

log = logging.getLogger(__name__)

SLOW_LATENCY_S = 0.25  # per chunk relayed (64 KiB at most) while the store is slow


class ChaosObjectStore:
    def __init__(self, store: LocalObjectStore, *, user: bool = False) -> None:
        self.store = store
        self.proxy = FaultProxy(store.host, store.port)
        self.user: Credentials | None = None
        if user:
            created = new_credentials()
            self.user = Credentials(f"CHAOS{created.access_key[4:]}", created.secret_key)

    @classmethod
    def running(cls, folder: Path, *, user: bool = False) -> ChaosObjectStore:
        """The store that runs from ``folder``; ``ObjectStoreStopped`` (exit 4) when none does."""
        store = LocalObjectStore(folder)
        if store.running_pid() is None:
            raise ObjectStoreStopped(store.state_dir)
        return cls(store, user=user)

    def open(self) -> ChaosObjectStore:
        self.proxy.start()
        self.add_user()
        return self

    def close(self) -> None:
        self.store.resume()  # a run stopped during a stall leaves the store running
        self.proxy.stop()
        try:
            self.remove_user()
        except MixflowError as exc:  # the store stopped meanwhile: its user stays, with keys nobody else has
            log.warning("the run's user of the object store stays: %s", exc)

    def add_user(self) -> None:
        if self.user is not None:
            self.store.add_user(self.user.access_key, self.user.secret_key)

    def remove_user(self) -> None:
        if self.user is not None:
            self.store.remove_user(self.user.access_key)

    def environment(self) -> dict[str, str]:
        """The roles' ``AWS_*`` variables: the store's keys (the run's user's, with one) and region, the
        proxy's endpoint."""
        keys = {}
        if self.user is not None:
            keys = {"AWS_ACCESS_KEY_ID": self.user.access_key, "AWS_SECRET_ACCESS_KEY": self.user.secret_key}
        return {**self.store.environment(), **keys, "AWS_ENDPOINT_URL": self.proxy.endpoint}

    @contextmanager
    def environ(self) -> Iterator[None]:
        """This process's environment with ``environment()`` in it, restored after: for the audit, which
        reads the sources as the loaders do."""
        saved = {name: os.environ.get(name) for name in self.environment()}
        os.environ.update(self.environment())
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def for_run(self, spec_body: dict[str, Any]) -> dict[str, Any]:
        """``spec_body`` (a spec as plain data) as the run's roles read it: through the proxy, and with the run's
        user, with that user's keys (from the environment) in every ``storage`` section in place of the
        credentials or profile it names."""
        body = self.through_proxy(spec_body)
        if self.user is None:
            return body
        keys = {"access_key_id": {"env": "AWS_ACCESS_KEY_ID"}, "secret_access_key": {"env": "AWS_SECRET_ACCESS_KEY"}}
        for section in [body, *body.get("sources", [])]:
            storage = section.get("storage")
            if isinstance(storage, dict) and (section is body or "credentials" in storage or "profile" in storage):
                storage.pop("profile", None)
                storage["credentials"] = keys
        return body

    def through_proxy(self, spec_body: Any) -> Any:
        """``spec_body`` (a spec as plain data) with every string that is the store's endpoint (a source's
        ``storage.endpoint_url``) replaced by the proxy's."""
        if isinstance(spec_body, dict):
            return {key: self.through_proxy(value) for key, value in spec_body.items()}
        if isinstance(spec_body, list):
            return [self.through_proxy(value) for value in spec_body]
        if isinstance(spec_body, str) and spec_body.rstrip("/") == self.store.endpoint:
            return self.proxy.endpoint
        return spec_body

    def strike(self, fault: Fault, wait: Callable[[float], None]) -> float:
        """Inflict ``fault`` for ``fault.down_s`` (``wait(seconds)`` passes the time, supervising the roles);
        seconds from the fault until the store answered again or the faults ended."""
        struck = time.monotonic()
        if fault.kind is FaultKind.RESTART_OBJECT_STORE:
            self.store.stop()
            wait(fault.down_s)
            self.store.start()
        elif fault.kind is FaultKind.STALL_OBJECT_STORE:
            self.store.pause()
            try:
                wait(fault.down_s)
            finally:
                self.store.resume()
        else:
            slow = fault.kind is FaultKind.SLOW_OBJECT_STORE
            faults = Faults(latency_s=SLOW_LATENCY_S) if slow else Faults(refuse=True)
            self.proxy.set_faults(faults.lasting(fault.down_s, time.monotonic()))
            if not slow:
                self.proxy.reset_connections()
            wait(fault.down_s)
            self.proxy.clear()
        return time.monotonic() - struck
