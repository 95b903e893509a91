"""Ranged GETs through obstore: every store answer classified as botocore's is, the bucket addressed as botocore
addresses it, keys obstore cannot name read through boto3, and real GETs pinned to an ETag."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from obstore import exceptions

from connectors.storage import ObjectChangedError, ObjectMissingError, StorageAccessError, StorageError
from connectors.storage.faults import classify
from connectors.storage.retry import TransientError
from connectors.storage.s3 import S3Storage
from connectors.storage.s3_get import GetFailed, KeyNotSupported, RangedGets, StoreAnswer, answer_of, virtual_hosted
from tests.s3_support import S3Server, running_server
from tests.test_s3_faults import STORE_ANSWERS

_RAISED_AS = {412: exceptions.PreconditionError, 403: exceptions.PermissionDeniedError, 404: FileNotFoundError}
"""The exception obstore raises for a status (a 404 is Python's own FileNotFoundError)."""


def _obstore_error(status: int, code: str, message: str) -> Exception:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
    text = (
        "Generic S3 error: Error performing GET http://store/b/k in 812.3µs - Server returned non-2xx status "
        f"code: {status} Some Reason: {body if code else ''}"
    )
    return _RAISED_AS.get(status, exceptions.GenericError)(text)


@pytest.mark.parametrize(("status", "code", "kind"), STORE_ANSWERS)
def test_every_store_answer_through_obstore_is_classified_as_through_botocore(
    status: int, code: str, kind: type
) -> None:
    raised = _obstore_error(status, code, "the server's words")
    assert answer_of(raised) == StoreAnswer(status, code, "the server's words" if code else "")
    known = classify(GetFailed(str(raised), answer_of(raised)), "s3://b/k", "http://store")
    assert type(known) is kind, known
    if kind is StorageAccessError:
        assert known.exit_code == 5 and "s3://b/k" in str(known) and (code or str(status)) in str(known)


@pytest.mark.parametrize(
    "raised",
    [
        exceptions.GenericError(
            "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k - HTTP error: error sending request"
        ),
        TimeoutError("timed out"),
        ConnectionResetError("reset by peer"),
    ],
)
def test_a_get_that_got_no_answer_is_tried_again(raised: Exception) -> None:
    known = classify(GetFailed(str(raised), answer_of(raised)), "s3://b/k", "http://store")
    assert isinstance(known, TransientError) and "http://store did not answer" in str(known)


@pytest.mark.parametrize("style", ["auto", "path", "virtual"])
@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9000", "http://localhost:9000", "https://s3.example.com"])
@pytest.mark.parametrize("bucket", ["corpus", "my-bucket-2", "a.b.c", "Upper"])
def test_the_bucket_is_addressed_as_botocore_addresses_it(style: str, endpoint: str | None, bucket: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        config=Config(s3={"addressing_style": style}),
    )
    try:
        url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    except Exception:
        pytest.skip("botocore refuses this combination")
    if "." in bucket and endpoint and "127.0.0.1" in endpoint:
        pytest.skip("botocore names a dotted bucket before an IP address (a.b.c.127.0.0.1), no host at all")
    botocore_virtual = url.split("://", 1)[1].startswith(f"{bucket}.")
    assert virtual_hosted(bucket, style, endpoint) is botocore_virtual, url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


def _put(server: S3Server, key: str, body: bytes, **extra: str) -> str:
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
    )
    if "gets-bucket" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="gets-bucket")
    return client.put_object(Bucket="gets-bucket", Key=key, Body=body, **extra)["ETag"]


def test_a_ranged_get_is_pinned_to_its_etag_and_keeps_the_stored_encoding(server: S3Server) -> None:
    body = gzip.compress(b'{"text": "x"}\n' * 50)
    etag = _put(server, "dir/a b+ï%20.jsonl.gz", body, ContentEncoding="gzip")
    gets = RangedGets("gets-bucket", server.settings())
    got = gets.get("dir/a b+ï%20.jsonl.gz", 3, 40, etag)
    assert (got.data, got.content_encoding) == (body[3:40], "gzip")
    _put(server, "dir/a b+ï%20.jsonl.gz", b"overwritten")
    with pytest.raises(GetFailed) as failed:
        gets.get("dir/a b+ï%20.jsonl.gz", 0, 5, etag)
    assert failed.value.answer is not None and failed.value.answer.status == 412
    storage = S3Storage("s3://gets-bucket/dir", server.settings())
    with pytest.raises(ObjectChangedError, match="changed since planning"):
        storage.read_range("a b+ï%20.jsonl.gz", 0, 5, etag)
    with pytest.raises(ObjectMissingError, match="no such object"):
        storage.read_range("gone.jsonl", 0, 5, '"abc"')


def test_a_key_obstore_cannot_name_is_read_through_boto3(server: S3Server) -> None:
    etag = _put(server, "odd//empty-segment.txt", b"0123456789")
    with pytest.raises(KeyNotSupported):
        RangedGets("gets-bucket", server.settings()).get("odd//empty-segment.txt", 0, 4)
    storage = S3Storage("s3://gets-bucket", server.settings())
    assert storage.read_range("odd//empty-segment.txt", 2, 6, etag) == b"2345"


def test_revoked_keys_are_refused_not_retried(server: S3Server) -> None:
    _put(server, "k.txt", b"data")
    storage = S3Storage("s3://gets-bucket", server.settings(access_key_id="NOPE", secret_access_key="wrong"))
    with pytest.raises(StorageAccessError, match=r"s3://gets-bucket/k\.txt"):
        storage.read_range("k.txt", 0, 4)


def test_an_unreachable_endpoint_is_retried_until_the_deadline(server: S3Server, tmp_path: Path) -> None:
    from dataclasses import replace

    from connectors.storage import StorageUnavailableError

    settings = server.settings(endpoint_url="http://127.0.0.1:1", first_contact_s=1.0)
    settings = replace(settings, retry=replace(settings.retry, deadline_s=1.0, backoff_s=0.05))
    with pytest.raises(StorageUnavailableError, match="did not answer"):
        S3Storage("s3://gets-bucket", settings).read_range("k.txt", 0, 4)


def test_the_ca_bundle_botocore_trusts_is_trusted_by_the_gets_too(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.tools.stack.tls import new_ca

    bundle = tmp_path / "private-ca.pem"
    bundle.write_bytes(new_ca("a private store's CA").certificate_pem())
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    gets = RangedGets("gets-bucket", server.settings())
    assert gets.store.client_options is not None
    assert gets.store.client_options["root_certificate"] == bundle.read_bytes()
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(StorageError, match=r"missing\.pem"):
        RangedGets("gets-bucket", server.settings())
