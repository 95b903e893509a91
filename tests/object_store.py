"""The test session's object store: a real Versity S3 Gateway (``LocalObjectStore``) on a free port in a
temporary folder, started once per session by the ``object_store`` fixture of ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.tools.stack.local_broker import free_port_block
from pipeline.tools.stack.object_store import REGION, LocalObjectStore


@dataclass(frozen=True)
class ObjectStoreEndpoint:
    """What a test needs to reach the store: the endpoint URL, the keys, the files holding them, and the
    server itself (for the tests that restart or pause it)."""

    store: LocalObjectStore
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = REGION

    @property
    def credentials_file(self) -> Path:
        return self.store.credentials_file

    @property
    def env_file(self) -> Path:
        return self.store.env_file

    def through(self, endpoint_url: str) -> ObjectStoreEndpoint:
        """The same store reached at another endpoint: a ``FaultProxy`` in front of it."""
        return replace(self, endpoint_url=endpoint_url)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for ``boto3.client("s3", **options)`` (endpoint, region, keys)."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
        }

    def environment(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point the standard credential chain and endpoint at the store."""
        return {**self.store.environment(), "AWS_ENDPOINT_URL": self.endpoint_url}

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client of the store; ``config`` goes to ``botocore.config.Config`` (timeouts, retries)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", config=Config(**config), **self.client_options())

    def bucket(self, name: str) -> str:
        """Create the bucket ``name`` unless it exists; return its name."""
        client = self.client()
        with suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name


@contextmanager
def running_object_store(state_dir: Path) -> Iterator[ObjectStoreEndpoint]:
    """A store of its own in ``state_dir`` on a free port (below the ephemeral range, so that a restart
    finds the port free), stopped at exit."""
    store = LocalObjectStore(state_dir, port=free_port_block(1))
    endpoint = store.start()
    try:
        credentials = store.credentials()
        yield ObjectStoreEndpoint(store, endpoint, credentials.access_key, credentials.secret_key)
    finally:
        store.stop()
