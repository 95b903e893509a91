"""`mixflow objects put SRC s3://bucket/prefix` and `mixflow objects ls s3://bucket/prefix`: a folder's files into
an S3-compatible bucket (a job's sources served from an object store), and what a prefix holds.

The endpoint and keys come from boto3's standard chain (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...,
shared files, ``AWS_PROFILE``), ``--endpoint-url`` and ``--profile``, or with ``--local`` (``--object-store-dir``)
from the local object store of `mixflow stack up --object-store`. Keys are never printed."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import positive_float, positive_int
from pipeline.cli.command import Command
from pipeline.tools.stack.object_store import default_object_store_dir


def _add_connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint-url", help="the S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS's)")
    parser.add_argument("--profile", help="a profile of the AWS shared files (default: $AWS_PROFILE or default)")
    parser.add_argument("--region", help="the region (default: the chain's, else us-east-1)")
    parser.add_argument(
        "--local",
        action="store_true",
        help=f"the local object store of `mixflow stack up --object-store`: its endpoint and keys, from "
        f"--object-store-dir (default: {default_object_store_dir()})",
    )
    parser.add_argument("--object-store-dir", type=Path, default=None, help="the local object store's folder")
    parser.add_argument(
        "--timeout-s",
        type=positive_float,
        default=10.0,
        help="how long a request waits for the store to connect or answer; it is tried twice, then reported "
        "(default: %(default)s)",
    )


def _client(args: argparse.Namespace) -> Any:
    import boto3
    from botocore.config import Config

    # A store that accepts connections and never answers is reported after two tries of --timeout-s each.
    tries = {"total_max_attempts": 2, "mode": "standard"}
    config = Config(connect_timeout=args.timeout_s, read_timeout=args.timeout_s, retries=tries)
    options: dict[str, Any] = {"endpoint_url": args.endpoint_url, "region_name": args.region, "config": config}
    if args.local or args.object_store_dir is not None:
        from pipeline.tools.stack.object_store import LocalObjectStore, ObjectStoreStopped

        store = LocalObjectStore(args.object_store_dir or default_object_store_dir())
        if store.running_pid() is None:
            raise ObjectStoreStopped(store.state_dir)
        env = store.environment()
        options = {
            "endpoint_url": args.endpoint_url or env["AWS_ENDPOINT_URL"],
            "region_name": args.region or env["AWS_REGION"],
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            "config": config,
        }
    session = boto3.Session(profile_name=args.profile)
    if options["region_name"] is None and session.region_name is None:
        options["region_name"] = "us-east-1"
    return session.client("s3", **options)


def _add_put_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a folder (every file under it) or a file")
    parser.add_argument("destination", help="s3://bucket or s3://bucket/prefix: the files' keys are the prefix/ + path")
    parser.add_argument("--create-bucket", action="store_true", help="create the bucket when it does not exist")
    parser.add_argument("--threads", type=positive_int, default=8, help="files sent at once (default: %(default)s)")
    _add_connection(parser)


def _put(args: argparse.Namespace) -> int:
    from pipeline.tools.objects import Destination, ensure_bucket, plan_upload, upload

    destination = Destination.parse(args.destination)
    uploads = plan_upload(args.source, destination)
    client = _client(args)
    if args.create_bucket and ensure_bucket(client, destination.bucket):
        print(f"created bucket {destination.bucket}")
    began = time.monotonic()
    sent = upload(client, destination, uploads, threads=args.threads)
    took = time.monotonic() - began
    print(f"put {len(uploads)} files, {sent:,} bytes, into {destination} in {took:.1f} s")
    return 0


def _add_ls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", help="s3://bucket or s3://bucket/prefix")
    _add_connection(parser)


def _ls(args: argparse.Namespace) -> int:
    from pipeline.tools.objects import Destination, s3_error

    where = Destination.parse(args.prefix)
    client = _client(args)
    prefix = f"{where.prefix}/" if where.prefix else ""
    count = total = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                print(f"{item['Size']:>14,}  {item['ETag'].strip(chr(34))}  s3://{where.bucket}/{item['Key']}")
                count, total = count + 1, total + int(item["Size"])
    except Exception as exc:
        raise s3_error(exc, where.bucket, None) from exc
    print(f"{count} objects, {total:,} bytes")
    return 0


ACTIONS = (
    Command(
        name="put",
        help="upload a folder's files (or a file) under s3://bucket/prefix",
        add_arguments=_add_put_arguments,
        run=_put,
    ),
    Command(name="ls", help="list the objects under s3://bucket/prefix", add_arguments=_add_ls_arguments, run=_ls),
)
