"""A source's storage as its spec names it: a local folder, or an ``s3://`` prefix reached with the settings
of its ``storage`` section (credentials resolved from their references here, held only by the client)."""

from __future__ import annotations

from dataclasses import replace

from connectors.storage import STORAGE_RETRY, Storage, storage_for
from connectors.storage.s3 import FIRST_CONTACT_S, S3Settings
from pipeline.spec import SourceSpec
from pipeline.spec.storage import StorageSpec


def source_storage(spec: SourceSpec, *, patient: bool = False) -> Storage:
    """``patient``: a role waits for an endpoint it has not reached yet as long as for one it lost
    (``retry_deadline_s``), so a loader started during a storage outage rides it out; a command reports it
    after a few seconds."""
    if not spec.in_object_store:
        return storage_for(spec.path)
    return storage_for(spec.path, s3_settings(spec.storage or StorageSpec(), f"source {spec.name}", patient=patient))


def s3_settings(storage: StorageSpec, what: str, *, patient: bool = False) -> S3Settings:
    """``storage`` as the client's settings; a missing credential variable or file is a ``MixflowError``
    naming it (``what`` says whose)."""
    credentials = storage.credentials
    keys: dict[str, str | None] = {}
    if credentials is not None:
        keys["access_key_id"] = credentials.access_key_id.resolve(f"{what}: storage.credentials.access_key_id")
        keys["secret_access_key"] = credentials.secret_access_key.resolve(
            f"{what}: storage.credentials.secret_access_key"
        )
        if credentials.session_token is not None:
            keys["session_token"] = credentials.session_token.resolve(f"{what}: storage.credentials.session_token")
    return S3Settings(
        endpoint_url=storage.endpoint_url,
        region=storage.region,
        addressing_style=storage.addressing_style,
        profile=storage.profile,
        connect_timeout_s=storage.connect_timeout_s,
        read_timeout_s=storage.read_timeout_s,
        retry=replace(STORAGE_RETRY, deadline_s=storage.retry_deadline_s),
        first_contact_s=storage.retry_deadline_s if patient else FIRST_CONTACT_S,
        stop_on_changed=storage.on_changed_object == "stop",
        **keys,  # type: ignore[arg-type]
    )
