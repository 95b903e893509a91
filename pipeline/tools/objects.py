"""Put a local folder's files into an S3-compatible bucket (``mixflow objects put``), to serve a job's sources
from an object store: the example's data into the local store, a benchmark's files into any endpoint.

``plan_upload`` is pure (which file goes to which key); ``upload`` sends the plan with boto3's managed
transfers (multipart for large files) on a few threads; ``s3_error`` turns the client's errors into one
line naming the bucket and key."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from topics.errors import MixflowError, NotFoundError, RefusedError

SCHEME = "s3://"
DENIED = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden", "403"})
MISSING = frozenset({"NoSuchBucket", "NotFound", "404"})


@dataclass(frozen=True)
class Destination:
    bucket: str
    prefix: str  # without a leading or trailing '/'; '' for the bucket's top

    @classmethod
    def parse(cls, uri: str) -> Destination:
        """``s3://bucket`` or ``s3://bucket/prefix``."""
        if not uri.startswith(SCHEME) or not (rest := uri[len(SCHEME) :]).split("/", 1)[0]:
            msg = f"{uri!r} is not an s3://bucket[/prefix] address"
            raise MixflowError(msg)
        bucket, _, prefix = rest.partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True)
class Upload:
    source: Path
    key: str
    size: int


def plan_upload(source: Path, destination: Destination) -> list[Upload]:
    """Every regular file under ``source`` (or ``source`` itself, a file) with its key: the prefix, then its
    path relative to ``source`` with '/' separators (a file alone keeps its name). Sorted by key."""
    if not source.exists():
        msg = f"{source} does not exist"
        raise NotFoundError(msg)
    if source.is_file():
        return [Upload(source, destination.key(source.name), source.stat().st_size)]
    uploads = []
    for folder, _, names in os.walk(source):
        for name in names:
            path = Path(folder) / name
            if path.is_file():
                relative = PurePosixPath(*path.relative_to(source).parts).as_posix()
                uploads.append(Upload(path, destination.key(relative), path.stat().st_size))
    return sorted(uploads, key=lambda upload: upload.key)


def upload(
    client: Any,
    destination: Destination,
    uploads: Iterable[Upload],
    *,
    threads: int = 8,
    done: Callable[[Upload], None] | None = None,
) -> int:
    """Send ``uploads`` to ``destination``'s bucket; the bytes sent. ``done`` is called after each file."""

    def send(item: Upload) -> int:
        try:
            client.upload_file(str(item.source), destination.bucket, item.key)
        except Exception as exc:
            raise s3_error(exc, destination.bucket, item.key) from exc
        if done is not None:
            done(item)
        return item.size

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(send, uploads))


def ensure_bucket(client: Any, bucket: str) -> bool:
    """Create ``bucket`` unless it exists; True when it was created."""
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except Exception as exc:
        if _code(exc) not in MISSING:
            raise s3_error(exc, bucket, None) from exc
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as exc:
        raise s3_error(exc, bucket, None) from exc
    return True


def s3_error(exc: BaseException, bucket: str, key: str | None) -> MixflowError:
    """One line for what went wrong with ``bucket`` (and ``key``): not found (exit 4), refused (exit 5:
    wrong keys, no permission), or another failure (an unreachable endpoint, no credentials)."""
    where = f"s3://{bucket}/{key}" if key else f"bucket {bucket!r}"
    code = _code(exc)
    if code in MISSING:
        return NotFoundError(f"{where}: the bucket does not exist ({code}); --create-bucket creates it")
    if code in DENIED:
        return RefusedError(f"{where}: refused ({code}): check the credentials and the bucket's permissions")
    if isinstance(exc, MixflowError):
        return exc
    reason = f"{code}: {exc}" if code else f"{type(exc).__name__}: {exc}"
    return MixflowError(f"{where}: {reason}")


def _code(exc: BaseException | None) -> str | None:
    """The S3 error code of a botocore ``ClientError``, or of the one that caused ``exc`` (boto3's managed
    transfers wrap it); None for other errors."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            error, meta = response.get("Error", {}), response.get("ResponseMetadata", {})
            return str(error.get("Code") or meta.get("HTTPStatusCode"))
        exc = exc.__cause__ or exc.__context__
    return None
