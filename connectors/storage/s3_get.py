"""Ranged GETs of S3 objects through obstore (the Python binding of Rust's ``object_store``).

A unit of a small object is one GET, and botocore spends about 1.4 ms of the loader's CPU on each (resolving the
endpoint ruleset per key, signing, parsing, event hooks), holding the GIL that the loader's tokenizing needs.
obstore's GET costs about 0.3 ms, most of it on its own threads without the GIL. Listings and HEADs stay with
boto3 (``connectors.storage.s3``); a GET goes here, to the same endpoint, bucket, addressing style, credentials
(given ones, or boto3's chain for the profile through obstore's ``Boto3CredentialProvider``), CA bundle and
timeouts, with obstore's own retries off: ``RetryPolicy`` retries what is transient. Its errors carry the
store's status and XML ``<Code>``, which ``answer_of`` reads back for ``faults.classify``. A key obstore cannot
name (an empty segment, ``.`` or ``..`` as a segment) raises ``KeyNotSupported``: boto3 reads that one."""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from connectors.storage.base import StoredBytes
from connectors.storage.errors import StorageAccessError, StorageError

if TYPE_CHECKING:
    from obstore.store import S3Store

    from connectors.storage.s3_settings import S3Settings

DEFAULT_REGION = "us-east-1"
_VIRTUAL_HOSTABLE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")


class KeyNotSupported(Exception):
    """obstore refuses the key as a path (an empty or dot segment); another client must read it."""


class StoreAnswer(NamedTuple):
    """What the store answered to a failed request: HTTP status, its XML error code and message (any may be
    missing: 0 or "")."""

    status: int
    code: str
    message: str


class GetFailed(Exception):
    """A GET that failed: ``answer``, what the store answered (None where no answer came: no connection, a
    timeout); the message is the client's first line."""

    def __init__(self, message: str, answer: StoreAnswer | None) -> None:
        super().__init__(message)
        self.answer = answer


class RangedGets:
    """Ranged GETs of one bucket's objects."""

    def __init__(self, bucket: str, settings: S3Settings) -> None:
        self.store = _make_store(bucket, settings)

    def get(self, key: str, start: int, stop: int, etag: str = "") -> StoredBytes:
        """Bytes ``[start, stop)`` of ``key`` (``stop > start``) and its ``Content-Encoding``, pinned to ``etag``."""
        import obstore
        from obstore import exceptions

        options: dict[str, Any] = {"range": (start, stop)}
        if etag:
            options["if_match"] = etag
        try:
            result = obstore.get(self.store, key, options=options)  # type: ignore[arg-type]
            data = bytes(result.bytes())
        except ValueError as exc:  # its path parser, before any request
            raise KeyNotSupported(str(exc)) from exc
        except (OSError, exceptions.BaseError) as exc:  # a 404 comes as FileNotFoundError
            raise GetFailed(str(exc).strip().split("\n", 1)[0], answer_of(exc)) from exc
        return StoredBytes(data, str(result.attributes.get("Content-Encoding", "")))


def answer_of(exc: BaseException) -> StoreAnswer | None:
    """The store's answer inside an obstore error; None where no answer came (no connection, a timeout)."""
    from obstore import exceptions

    text = str(exc)
    status = _STATUS.search(text)
    code, message = _CODE.search(text), _MESSAGE.search(text)
    if status is None:
        known = {
            exceptions.PreconditionError: 412,
            exceptions.PermissionDeniedError: 403,
            exceptions.UnauthenticatedError: 403,
            exceptions.NotFoundError: 404,
            FileNotFoundError: 404,
        }
        found = next((value for kind, value in known.items() if isinstance(exc, kind)), None)
        if found is None:
            return None
        return StoreAnswer(found, code.group(1) if code else "", message.group(1) if message else "")
    return StoreAnswer(int(status.group(1)), code.group(1) if code else "", message.group(1) if message else "")


def _make_store(bucket: str, settings: S3Settings) -> S3Store:
    from obstore.store import S3Store

    bound = min(settings.retry.deadline_s, settings.first_contact_s)
    endpoint = settings.endpoint_url
    client_options: dict[str, Any] = {
        "connect_timeout": timedelta(seconds=min(settings.connect_timeout_s, bound)),
        "timeout": timedelta(seconds=min(settings.read_timeout_s, bound)),
        "allow_http": bool(endpoint and endpoint.startswith("http://")),
    }
    if (certificates := _ca_bundle(settings)) is not None:
        client_options["root_certificate"] = certificates
    virtual = virtual_hosted(bucket, settings.addressing_style, endpoint)
    if endpoint and virtual:
        parts = urlsplit(endpoint)
        endpoint = parts._replace(netloc=f"{bucket}.{parts.netloc}").geturl()
    arguments: dict[str, Any] = {
        "endpoint": endpoint,
        "virtual_hosted_style_request": virtual,
        "client_options": client_options,
        "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=bound)},
    }
    try:
        if settings.access_key_id is not None:
            arguments |= {
                "access_key_id": settings.access_key_id,
                "secret_access_key": settings.secret_access_key,
                "session_token": settings.session_token,
                "region": settings.region or DEFAULT_REGION,
            }
        else:
            arguments |= _credential_chain(settings)
        return S3Store(bucket, **{name: value for name, value in arguments.items() if value is not None})
    except StorageError:
        raise
    except Exception as exc:  # obstore's configuration errors, botocore's ProfileNotFound, ...
        raise StorageError(f"cannot make an S3 client for {settings.endpoint_url or 'AWS'}: {exc}") from exc


def _ca_bundle(settings: S3Settings) -> bytes | None:
    """The CA certificates botocore would trust besides the system's (``AWS_CA_BUNDLE`` or the profile's
    ``ca_bundle``), so that a store behind a private CA answers both clients."""
    import botocore.session

    path = botocore.session.Session(profile=settings.profile).get_config_variable("ca_bundle")
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        msg = f"cannot read the CA bundle {path} (AWS_CA_BUNDLE or the profile's ca_bundle): {exc}"
        raise StorageError(msg) from exc


def _credential_chain(settings: S3Settings) -> dict[str, Any]:
    """boto3's credentials for the settings' profile (environment, shared files, SSO, instance roles), refreshed
    as boto3 refreshes them."""
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider

    session = boto3.session.Session(profile_name=settings.profile, region_name=settings.region)
    if session.get_credentials() is None:
        hint = "set them in the environment or name them in the spec"
        raise StorageAccessError(f"{settings.endpoint_url or 'AWS'}: no AWS credentials ({hint})")
    region = settings.region or session.region_name or DEFAULT_REGION
    return {"credential_provider": Boto3CredentialProvider(session), "region": region}


def virtual_hosted(bucket: str, style: str, endpoint: str | None) -> bool:
    """Whether requests name the bucket in the host, as botocore decides for ``addressing_style``: ``auto`` only on
    AWS itself; ``auto`` and ``virtual`` only for a bucket that can be a host name (a dotted one not over HTTPS)
    on an endpoint that is not an IP address."""
    if style == "path" or (style == "auto" and endpoint is not None):
        return False
    if _VIRTUAL_HOSTABLE.fullmatch(bucket) is None or ".." in bucket:
        return False
    parts = urlsplit(endpoint or "https://s3.amazonaws.com")
    if "." in bucket and parts.scheme == "https":
        return False
    try:
        ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return True
    return False
