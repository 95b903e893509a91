"""A source's storage as its spec names it: a local folder, or an ``s3://`` prefix reached with the settings
of its ``storage`` section (credentials resolved from their references here, held only by the client)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from connectors.storage import RetryPolicy, Storage, storage_for
from connectors.storage.s3 import FIRST_CONTACT_S, S3Settings
from pipeline.spec import JobSpec, SourceSpec, SpecProblem
from pipeline.spec.storage import StorageSpec
from topics.errors import MixflowError

_CHECK_THREADS = 8  # object-store sources checked at once


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
        retry=RetryPolicy(deadline_s=storage.retry_deadline_s),
        first_contact_s=storage.retry_deadline_s if patient else FIRST_CONTACT_S,
        stop_on_changed=storage.on_changed_object == "stop",
        **keys,  # type: ignore[arg-type]
    )


def check_object_sources(spec: JobSpec, file: str | Path = "") -> list[SpecProblem]:
    """``spec check --files`` for the sources in an object store: each prefix listed, and its glob matched,
    with the store's reason (access denied, no such bucket, an endpoint that does not answer) otherwise. The
    sources are listed at once, so a store that does not answer costs one bound (``retry_deadline_s``, at most a
    command's first contact), not one per source."""
    located = [(i, source) for i, source in enumerate(spec.sources) if source.in_object_store]
    if not located:
        return []
    with ThreadPoolExecutor(min(len(located), _CHECK_THREADS), thread_name_prefix="spec-check") as pool:
        found = pool.map(lambda pair: _object_source_problem(*pair, file), located)
        return [problem for problem in found if problem is not None]


def _object_source_problem(i: int, source: SourceSpec, file: str | Path) -> SpecProblem | None:
    from connectors.readers import SourceNotFoundError, make_reader

    try:
        content = "media" if source.multimodal else "tokens" if source.pretokenized else "text"
        storage = source_storage(source)
        kind = source.reader.value
        make_reader(kind, source.name, source.path, source.glob, content=content, storage=storage).files()
    except SourceNotFoundError as exc:
        return SpecProblem(f"sources[{i}].glob", str(exc), source.glob, str(file))
    except MixflowError as exc:
        return SpecProblem(f"sources[{i}].path", str(exc), str(source.path), str(file))
    return None
