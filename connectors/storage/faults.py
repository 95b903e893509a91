"""Which storage errors are worth trying again, and the message of each that is not: each names the server's code
and message (botocore's errors and obstore's both read as the store's status, code and message). A 404 means a
missing object only where its code is about the key (``NoSuchKey``, or none at all, as a HEAD answers); any
other 404 (an unknown access key answers ``XAdminUserNotFound`` on some gateways) is a refusal of the
credentials. ``S3Storage`` confirms a missing key with a listing before a unit is dead-lettered for it. An
obstore error with no answer in it (no connection, a timeout) is transient."""

from __future__ import annotations

from connectors.storage.errors import (
    ObjectChangedError,
    ObjectMissingError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
)
from connectors.storage.retry import TransientError
from connectors.storage.s3_get import GetFailed, StoreAnswer

_TRANSIENT_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException"}
)
_DENIED_CODES = frozenset(
    {
        "403",
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidSecurity",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)
_MISSING_KEY_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_CHANGED_CODES = frozenset({"412", "PreconditionFailed"})


def classify(exc: Exception, where: str, endpoint: str | None, etag: str = "") -> Exception:
    """``exc``, raised by a request for ``where`` (``s3://bucket/key``), as a ``TransientError`` to retry or
    the ``StorageError`` to report; anything else comes back as it is."""
    from botocore import exceptions as botocore_errors

    if isinstance(exc, StorageError | TransientError):
        return exc
    if isinstance(exc, botocore_errors.ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return _answered(StoreAnswer(status, str(error.get("Code", "")), error.get("Message", "")), where, etag)
    if isinstance(exc, GetFailed):
        if exc.answer is None:
            return TransientError(f"endpoint {endpoint or 'AWS'} did not answer: {exc}")
        return _answered(exc.answer, where, etag)
    if isinstance(exc, botocore_errors.NoCredentialsError | botocore_errors.PartialCredentialsError):
        hint = "set them in the environment or name them in the spec"
        return StorageAccessError(f"{where}: no AWS credentials: {exc} ({hint})")
    if isinstance(exc, botocore_errors.ParamValidationError):
        return StorageError(f"{where}: invalid request: {exc}")
    reachable = (
        botocore_errors.EndpointConnectionError,
        botocore_errors.ConnectionClosedError,
        botocore_errors.ConnectTimeoutError,
        botocore_errors.ReadTimeoutError,
        botocore_errors.ResponseStreamingError,
        botocore_errors.HTTPClientError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(exc, reachable):
        return TransientError(f"endpoint {endpoint or 'AWS'} did not answer: {exc}")
    return exc


def _answered(answer: StoreAnswer, where: str, etag: str) -> Exception:
    status, code = answer.status, answer.code
    message = answer.message or code or "no message"
    said = f"{status} {code}" if code and code != str(status) else str(status or code)
    if code in _TRANSIENT_CODES or status >= 500 or status == 429:
        return TransientError(f"{where}: {code or status} {message}")
    if code in _CHANGED_CODES or status == 412:
        return ObjectChangedError(f"{where}: changed since planning (ETag {etag} planned; 412 Precondition Failed)")
    if code == "NoSuchBucket":
        return StorageNotFoundError(f"{where}: no such bucket ({message})")
    if code in _DENIED_CODES or status == 403:
        return StorageAccessError(
            f"{where}: access denied ({said}: {message}); check the credentials and the bucket policy"
        )
    if code in _MISSING_KEY_CODES or (status == 404 and not code):
        return ObjectMissingError(f"{where}: no such object ({said}); it vanished since planning")
    if status == 404:
        return StorageAccessError(
            f"{where}: the store answered {said}: {message}. That is not a missing object: the store refuses "
            "these credentials (an unknown or revoked access key); check them"
        )
    if code == "InvalidBucketName":
        return StorageError(f"{where}: invalid bucket name ({message})")
    return StorageError(f"{where}: {code or status}: {message}")
