"""``s3://bucket/prefix`` locations."""

from __future__ import annotations

import re
from dataclasses import dataclass

from connectors.storage.errors import StorageError

S3_SCHEME = "s3://"
# S3's bucket naming rules: 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending alphanumeric.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def is_object_uri(location: object) -> bool:
    return isinstance(location, str) and location.startswith(S3_SCHEME)


@dataclass(frozen=True, slots=True)
class ObjectUri:
    """A bucket and a key prefix (no leading or trailing '/'; empty for the whole bucket)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, uri: str) -> ObjectUri:
        """``s3://bucket/prefix`` split; ``StorageError`` naming what is wrong otherwise."""
        if not uri.startswith(S3_SCHEME):
            raise StorageError(f"{uri!r} is not an s3://bucket/prefix location")
        bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            msg = f"{uri}: bucket name {bucket!r} is not valid (3-63 lowercase letters, digits, '.' and '-')"
            raise StorageError(msg)
        return cls(bucket, prefix.strip("/"))

    def key(self, path: str) -> str:
        """The object key of ``path``, relative to the prefix."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def relative(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{S3_SCHEME}{self.bucket}"
