"""`mixflow objects put|ls` against the real local object store: which file goes to which key (pure, over
random trees), the bytes that arrive, and one line with the exit code of its kind for each mistake."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.tools.objects import Destination, plan_upload
from pipeline.tools.stack.local_broker import free_port_block
from pipeline.tools.stack.object_store import LocalObjectStore
from tests.object_store import ObjectStoreEndpoint
from topics.errors import MixflowError

NOT_FOUND, REFUSED, USAGE = 4, 5, 2

names = st.text(alphabet="abcxyz019_-.", min_size=1, max_size=8).filter(lambda name: name not in (".", ".."))
trees = st.dictionaries(st.lists(names, min_size=1, max_size=3).map(tuple), st.binary(max_size=64), max_size=12)


def _write_tree(root: Path, tree: dict[tuple[str, ...], bytes]) -> dict[str, bytes]:
    """The files of ``tree`` under ``root`` (a path that is a prefix of another is left out); relative path -> bytes."""
    written = {}
    for parts, body in tree.items():
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            continue
        written["/".join(parts)] = body
    return {relative: body for relative, body in written.items() if root.joinpath(relative).is_file()}


@given(tree=trees, prefix=st.sampled_from(["", "data", "a/b/"]))
def test_every_file_gets_the_prefix_and_its_relative_path_as_its_key(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[tuple[str, ...], bytes], prefix: str
) -> None:
    root = tmp_path_factory.mktemp("tree")
    files = _write_tree(root, tree)
    destination = Destination.parse(f"s3://bucket/{prefix}")
    plan = plan_upload(root, destination)
    expected = sorted((f"{prefix.strip('/')}/{relative}".lstrip("/"), len(body)) for relative, body in files.items())
    assert [(upload.key, upload.size) for upload in plan] == expected


def test_addresses_are_checked() -> None:
    assert Destination.parse("s3://b") == Destination("b", "")
    assert Destination.parse("s3://b/p/q/") == Destination("b", "p/q")
    assert str(Destination.parse("s3://b/p/q/")) == "s3://b/p/q"
    for bad in ("b/p", "s3:///p", "file:///x"):
        with pytest.raises(MixflowError, match="is not an s3://bucket"):
            Destination.parse(bad)


def test_put_then_ls_a_folder_into_the_local_store(
    object_store: ObjectStoreEndpoint, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    files = _write_tree(tmp_path / "src", {("a.jsonl",): b'{"text": "x"}\n', ("sub", "b.parquet"): b"PAR1" * 100})
    local = ("--object-store-dir", str(object_store.store.state_dir))
    assert main(["objects", "put", str(tmp_path / "src"), "s3://put-ls/data", "--create-bucket", *local]) == 0
    out = capsys.readouterr().out
    assert "created bucket put-ls" in out and "put 2 files, 414 bytes, into s3://put-ls/data" in out
    assert object_store.secret_key not in out

    client = object_store.client()
    for relative, body in files.items():
        got = client.get_object(Bucket="put-ls", Key=f"data/{relative}")
        assert got["Body"].read() == body and got["ETag"].strip('"') == hashlib.md5(body).hexdigest()

    assert main(["objects", "ls", "s3://put-ls/data", *local]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[-1] == "2 objects, 414 bytes"
    assert [line.split()[-1] for line in listed[:-1]] == ["s3://put-ls/data/a.jsonl", "s3://put-ls/data/sub/b.parquet"]


def test_put_takes_the_standard_chain_and_says_what_is_wrong_in_one_line(
    object_store: ObjectStoreEndpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    source = tmp_path / "one.txt"
    source.write_text("one")
    for name, value in object_store.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    object_store.bucket("chain")
    assert main(["objects", "put", str(source), "s3://chain/p"]) == 0
    assert object_store.client().get_object(Bucket="chain", Key="p/one.txt")["Body"].read() == b"one"
    capsys.readouterr()

    assert main(["objects", "put", str(source), "s3://no-such-bucket/p"]) == NOT_FOUND
    assert "s3://no-such-bucket/p/one.txt: the bucket does not exist" in capsys.readouterr().err

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    assert main(["objects", "put", str(source), "s3://chain/p"]) == REFUSED
    err = capsys.readouterr().err
    assert "s3://chain/p/one.txt: refused (SignatureDoesNotMatch)" in err and "not-the-secret" not in err

    assert main(["objects", "put", str(tmp_path / "missing"), "s3://chain/p"]) == NOT_FOUND
    assert "missing does not exist" in capsys.readouterr().err

    stopped = LocalObjectStore(tmp_path / "stopped-store", port=free_port_block(1))
    assert main(["objects", "ls", "s3://chain", "--object-store-dir", str(stopped.state_dir)]) == NOT_FOUND
    assert "no local object store runs from" in capsys.readouterr().err


def test_a_large_file_goes_up_in_parts(object_store: ObjectStoreEndpoint, tmp_path: Path) -> None:
    body = bytes(range(256)) * (9 * 4096)  # 9 MiB: above boto3's 8 MiB multipart threshold
    (tmp_path / "big.bin").write_bytes(body)
    local = ("--object-store-dir", str(object_store.store.state_dir))
    assert main(["objects", "put", str(tmp_path / "big.bin"), "s3://multipart", "--create-bucket", *local]) == 0
    got = object_store.client().get_object(Bucket="multipart", Key="big.bin")
    assert got["ETag"].strip('"').endswith("-2"), "not a multipart upload"
    assert got["Body"].read() == body
