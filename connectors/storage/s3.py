"""Objects in an S3-compatible store: a paginated listing and HEADs through boto3, ranged GETs with ``If-Match``
through obstore (``s3_get``), every request tried once by its client and retried by one ``RetryPolicy`` with a
deadline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from connectors.storage.base import ObjectInfo, Storage, StoredBytes
from connectors.storage.errors import (
    ObjectChangedError,
    ObjectMissingError,
    ObjectRefusedError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
)
from connectors.storage.faults import classify
from connectors.storage.object_file import open_object
from connectors.storage.retry import TransientError
from connectors.storage.s3_get import KeyNotSupported, RangedGets
from connectors.storage.s3_settings import FIRST_CONTACT_S, S3Settings
from connectors.storage.uri import ObjectUri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # type: ignore[import-not-found]

T = TypeVar("T")
__all__ = ["FIRST_CONTACT_S", "S3Settings", "S3Storage"]
_LISTING_THREADS = 16  # sub-folders listed at once
FIRST_ANSWER_NOTICE_S = 2.0  # a first request unanswered this long says what it waits for
log = logging.getLogger(__name__)


class S3Storage(Storage):
    """The objects under ``s3://bucket/prefix``."""

    def __init__(self, uri: str | ObjectUri, settings: S3Settings | None = None) -> None:
        self.uri = uri if isinstance(uri, ObjectUri) else ObjectUri.parse(uri)
        self.settings = settings or S3Settings()
        self._client: S3Client | None = None
        self._gets: RangedGets | None = None
        self._lock = threading.Lock()
        self._reached = False

    @property
    def client(self) -> S3Client:
        with self._lock:
            if self._client is None:
                self._client = _make_client(self.settings)
            return self._client

    @property
    def gets(self) -> RangedGets:
        with self._lock:
            if self._gets is None:
                self._gets = RangedGets(self.uri.bucket, self.settings)
            return self._gets

    def list(self) -> list[ObjectInfo]:
        """One paginated listing of the root's own objects and its sub-folders, then each sub-folder listed
        whole on a pool of threads: a sharded prefix (``train/shard-000/...``) lists at the pace of the
        store's concurrency, a flat one in the same requests as a single listing."""
        found, folders = self._listing(self._root_prefix(), delimiter="/")
        if folders:
            with ThreadPoolExecutor(min(_LISTING_THREADS, len(folders)), thread_name_prefix="s3-list") as pool:
                for objects, _ in pool.map(self._listing, folders):
                    found += objects
        return sorted(found, key=lambda info: info.path)

    def _root_prefix(self) -> str:
        return f"{self.uri.prefix}/" if self.uri.prefix else ""

    def _listing(self, prefix: str, delimiter: str = "") -> tuple[list[ObjectInfo], list[str]]:
        """The objects under ``prefix``, every page of them, and with ``delimiter`` the folders below it."""
        found: list[ObjectInfo] = []
        folders: list[str] = []
        token: str | None = None
        while True:
            arguments: dict[str, Any] = {"Bucket": self.uri.bucket, "Prefix": prefix}
            if delimiter:
                arguments["Delimiter"] = delimiter
            if token:
                arguments["ContinuationToken"] = token
            page = self._request("", lambda arguments=arguments: self.client.list_objects_v2(**arguments))
            found += [
                ObjectInfo(self.uri.relative(item["Key"]), int(item["Size"]), item.get("ETag", ""))
                for item in page.get("Contents", ())
                if not item["Key"].endswith("/")
            ]
            folders += [entry["Prefix"] for entry in page.get("CommonPrefixes", ())]
            if not page.get("IsTruncated"):
                return found, folders
            token = page["NextContinuationToken"]

    def probe(self) -> None:
        arguments = {"Bucket": self.uri.bucket, "Prefix": self._root_prefix(), "MaxKeys": 1}
        page = self._request("", lambda: self.client.list_objects_v2(**arguments))
        if not page.get("Contents"):
            raise StorageNotFoundError(f"{self.describe()}: no object under this prefix")

    def info(self, path: str) -> ObjectInfo:
        return self._head(path)

    def _head(self, path: str, etag: str = "") -> ObjectInfo:
        """``info``; ``etag``, the version the caller expects, only says whether a 404 refuses a planned read."""
        head = self._request(
            path, lambda: self.client.head_object(Bucket=self.uri.bucket, Key=self.uri.key(path)), etag
        )
        return ObjectInfo(path, int(head["ContentLength"]), head.get("ETag", ""))

    def read_range(self, path: str, start: int, stop: int, etag: str = "") -> bytes:
        return self.read_stored(path, start, stop, etag).data

    def read_stored(self, path: str, start: int, stop: int, etag: str = "") -> StoredBytes:
        if stop <= start:
            return StoredBytes(b"")
        key = self.uri.key(path)

        def get() -> StoredBytes:
            try:
                return self.gets.get(key, start, stop, etag)
            except KeyNotSupported:
                return self._get_with_boto3(key, start, stop, etag)

        return self._request(path, get, etag)

    def _get_with_boto3(self, key: str, start: int, stop: int, etag: str) -> StoredBytes:
        arguments: dict[str, Any] = {"Bucket": self.uri.bucket, "Key": key, "Range": f"bytes={start}-{stop - 1}"}
        if etag:
            arguments["IfMatch"] = etag
        response = self.client.get_object(**arguments)
        # botocore hands back the stored bytes: a gzip Content-Encoding is not undone on the way
        data = response["Body"].read()  # a reset while streaming the body is retried with the request
        return StoredBytes(data, response.get("ContentEncoding", ""))

    def open(self, path: str, etag: str = "", *, size: int | None = None, buffer_bytes: int = 1 << 20) -> BinaryIO:
        if size is None or not etag:
            now = self._head(path, etag)
            if etag and now.etag != etag:
                self.read_range(path, 0, 1, etag)  # the store's own answer: 412, the object changed
            size, etag = now.size, etag or now.etag
        return open_object(self, path, size, etag, buffer_bytes)

    def describe(self, path: str = "") -> str:
        return f"s3://{self.uri.bucket}/{self.uri.key(path)}" if path else str(self.uri)

    def _request(self, path: str, call: Callable[[], T], etag: str = "") -> T:
        """``call()`` under the retry policy, each error classified (``faults.classify``) as transient or as
        the storage error it is, naming the bucket and key."""
        where = self.describe(path)

        def attempt() -> T:
            try:
                return call()
            except Exception as exc:
                known = classify(exc, where, self.settings.endpoint_url, etag)
                if known is exc:
                    raise
                if isinstance(known, ObjectMissingError) and path:
                    known = self._confirm_missing(path, known)
                if (
                    etag
                    and self.settings.stop_on_changed
                    and isinstance(known, ObjectChangedError | ObjectMissingError)
                ):
                    raise ObjectRefusedError(str(known)) from exc
                raise known from exc

        if self._reached:
            return self.settings.retry.call(attempt, f"reading {where}")
        # Until the store first answers, a wait longer than a moment says what it waits for (a store that accepts
        # connections and never answers is otherwise silent for up to a request's timeout).
        limit = self.settings.first_contact_s
        notice = f"waiting for {self.settings.endpoint_url or 'AWS'} to answer (reading {where}), up to {limit:.0f} s"
        timer = threading.Timer(FIRST_ANSWER_NOTICE_S, log.warning, (notice,))
        timer.daemon = True
        timer.start()
        try:
            result = self.settings.retry.call(attempt, f"reading {where}", limit)
        finally:
            timer.cancel()
        self._reached = True
        return result

    def _confirm_missing(self, path: str, missing: ObjectMissingError) -> Exception:
        """``missing`` once a listing under the same credentials says that the key is not there; otherwise what
        the listing says instead (the credentials refused, the store away, or the key there after all)."""
        key = self.uri.key(path)
        try:
            page = self.client.list_objects_v2(Bucket=self.uri.bucket, Prefix=key, MaxKeys=1)
        except Exception as exc:
            known = classify(exc, self.describe(path), self.settings.endpoint_url)
            if isinstance(known, ObjectMissingError):  # a listing answered 404 about no key: not the object's
                return StorageAccessError(f"{known}; and listing the bucket answered 404 too: check the credentials")
            return known
        if any(item.get("Key") == key for item in page.get("Contents", ())):
            return TransientError(f"{self.describe(path)}: the store answered 404 for a key its listing shows")
        return missing


def _make_client(settings: S3Settings) -> S3Client:
    import boto3
    from botocore.config import Config

    # A request waits for an answer at most as long as the store may be tried (the retry deadline, or a command's
    # first contact): a store that accepts connections and never answers is reported within that bound, each try
    # logged by the one retry policy, rather than after botocore's own tries of read_timeout_s each.
    bound = min(settings.retry.deadline_s, settings.first_contact_s)
    config = Config(
        region_name=settings.region,
        connect_timeout=min(settings.connect_timeout_s, bound),
        read_timeout=min(settings.read_timeout_s, bound),
        # One try per call: RetryPolicy retries what is transient, under its deadline and with a log line each.
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": settings.addressing_style},
        max_pool_connections=32,
    )
    try:
        session = boto3.session.Session(profile_name=settings.profile, region_name=settings.region)
        return session.client(
            "s3",
            endpoint_url=settings.endpoint_url,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            aws_session_token=settings.session_token,
            config=config,
        )
    except Exception as exc:  # botocore's ProfileNotFound, an invalid endpoint URL, ...
        raise StorageError(f"cannot make an S3 client for {settings.endpoint_url or 'AWS'}: {exc}") from exc
