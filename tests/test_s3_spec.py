"""A source in an object store in the spec: s3:// paths, the storage section per source or job-wide, and
credentials only as references (never inline, never shown)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.roles.loader.source_storage import s3_settings
from pipeline.spec import SpecError, load_spec
from topics.errors import MixflowError

STORAGE = {
    "endpoint_url": "http://127.0.0.1:7070",
    "region": "us-east-1",
    "addressing_style": "path",
    "credentials": {"access_key_id": {"env": "MIXFLOW_TEST_KEY"}, "secret_access_key": {"file": "secret.txt"}},
}


def _spec(tmp_path: Path, **changes: object) -> Path:
    body: dict = {
        "job": "t",
        "tokenizer": "tok.json",
        "sources": [
            {"name": "a", "reader": "jsonl", "path": "s3://corpus/web/a"},
            {"name": "b", "reader": "text", "path": "data/b"},
        ],
        "mixture": {"weights": {"a": 1, "b": 3}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 10.0},
        "storage": STORAGE,
    }
    body.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _problems(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


def test_an_s3_source_takes_the_job_storage_and_a_local_one_stays_a_path(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path))
    remote, local = spec.sources
    assert remote.path == "s3://corpus/web/a" and remote.in_object_store
    assert remote.storage is not None and remote.storage.endpoint_url == "http://127.0.0.1:7070"
    assert local.path == (tmp_path / "data" / "b").resolve() and not local.in_object_store and local.storage is None


def test_credentials_resolve_from_their_references_and_are_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secret.txt").write_text("s3cr3t-value\n")
    monkeypatch.setenv("MIXFLOW_TEST_KEY", "key-value")
    spec = load_spec(_spec(tmp_path))
    settings = s3_settings(spec.sources[0].storage, "source a")  # type: ignore[arg-type]
    assert (settings.access_key_id, settings.secret_access_key) == ("key-value", "s3cr3t-value")
    assert "s3cr3t" not in repr(settings) and "key-value" not in repr(settings)
    assert "s3cr3t" not in spec.model_dump_json()
    monkeypatch.delenv("MIXFLOW_TEST_KEY")
    with pytest.raises(MixflowError, match=r"access_key_id: .*MIXFLOW_TEST_KEY is not set"):
        s3_settings(spec.sources[0].storage, "source a")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"credentials": {**STORAGE["credentials"], "secret_access_key": "inline"}}, "never the secret itself"),
        ({"credentials": {**STORAGE["credentials"], "access_key_id": {}}}, "exactly one of env and file"),
        ({"addressing_style": "sideways"}, "addressing_style"),
        ({"endpoint_url": "127.0.0.1:7070"}, "endpoint_url"),
        ({"retry_deadline_s": 0}, "retry_deadline_s"),
    ],
)
def test_bad_storage_sections_are_named(tmp_path: Path, change: dict, message: str) -> None:
    assert message in _problems(_spec(tmp_path, storage={**STORAGE, **change}))


@pytest.mark.parametrize("uri", ["s3://A_bucket/x", "s3://ab", "s3://a..b/x"])
def test_bad_bucket_names_are_refused(tmp_path: Path, uri: str) -> None:
    sources = [{"name": "a", "reader": "jsonl", "path": uri}, {"name": "b", "reader": "text", "path": "b"}]
    assert "not an s3://bucket/prefix location" in _problems(_spec(tmp_path, sources=sources))


def test_a_local_source_has_no_storage_section(tmp_path: Path) -> None:
    sources = [
        {"name": "a", "reader": "jsonl", "path": "s3://corpus/a"},
        {"name": "b", "reader": "text", "path": "b", "storage": {"region": "eu-west-1"}},
    ]
    assert "only a source whose path is s3://bucket/prefix has a storage section" in _problems(
        _spec(tmp_path, sources=sources)
    )
