"""Secrets in a spec's Kafka settings: referenced, never inlined, resolved only for a client, never shown;
each role's principal laid over the job's settings, on the roles' side and the trainer's alike."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.spec import SpecError, load_spec
from topics.errors import MixflowError
from topics.kafka.settings import is_secret_key, redacted, resolve_settings, setting_problems
from trainer_sink.config import SinkSource

SENTINEL = "s3ntinel-PASSWORD-never-shown"
SECURE = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}


def _base(kafka: dict | None = None) -> dict:
    return {
        "job": "t",
        "kafka": kafka or {"bootstrap_servers": "k:1"},
        "tokenizer": "tok.json",
        "sources": [
            {"name": "a", "reader": "jsonl", "path": "data/a"},
            {"name": "b", "reader": "text", "path": "data/b"},
        ],
        "mixture": {"weights": {"a": 1, "b": 3}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 10.0},
    }


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _principal(user: str, variable: str) -> dict:
    return {"sasl.username": user, "sasl.password": {"env": variable}}


def _secured(tmp_path: Path) -> Path:
    principals = {
        "loader": _principal("t-loader", "PW_LOADER"),
        "loader.b": {"sasl.username": "t-loader-b", "sasl.password": {"file": str(tmp_path / "b.secret")}},
        "constructor": _principal("t-constructor", "PW_CONSTRUCTOR"),
        "trainer": _principal("t-trainer", "PW_TRAINER"),
    }
    return _write(tmp_path, _base({"bootstrap_servers": "k:1", "config": SECURE, "principals": principals}))


@pytest.mark.parametrize(
    "key", ["sasl.password", "ssl.key.password", "ssl.key.pem", "sasl.oauthbearer.client.secret", "x.passphrase"]
)
def test_a_literal_secret_is_refused_without_showing_it(tmp_path: Path, key: str, capsys) -> None:
    spec = _base({"config": {**SECURE, key: SENTINEL}})
    path = _write(tmp_path, spec)
    assert main(["spec", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"kafka.config['{key}']: a secret must not be written in the spec" in err
    assert "{env: VARIABLE} or {file: /path/to/secret}" in err
    assert SENTINEL not in err


def test_a_secret_of_the_wrong_type_or_a_bad_reference_is_refused_without_its_value(tmp_path: Path) -> None:
    principals = {"trainer": {"sasl.password": [SENTINEL]}, "observer": {"sasl.password": {"vault": SENTINEL}}}
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _base({"principals": principals})))
    text = str(info.value)
    assert "kafka.principals.observer['sasl.password']: a reference is {env: VARIABLE} or {file: PATH}" in text
    assert "kafka.principals.trainer['sasl.password']" in text
    assert SENTINEL not in text


def test_principal_keys_name_roles_or_sources(tmp_path: Path) -> None:
    principals = {"loaders": {}, "loader.c": {}, "loader.a": {}, "observer": {"bootstrap.servers": "x:1"}}
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _base({"principals": principals})))
    text = str(info.value)
    assert "kafka.principals.observer['bootstrap.servers']: set kafka.bootstrap_servers instead" in text
    spec = _base({"principals": {"loaders": {}, "loader.c": {}, "loader.a": {}}})
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, spec))
    text = str(info.value)
    assert "kafka.principals.loaders: not a role: one of loader, constructor, trainer, observer, operator" in text
    assert "kafka.principals['loader.c']: no source 'c' in the spec (sources: a, b)" in text
    assert "loader.a" not in text


def test_each_role_gets_its_principal_with_references_resolved(tmp_path: Path, capsys) -> None:
    path = _secured(tmp_path)
    (tmp_path / "b.secret").write_text("pw-b\n")
    assert main(["spec", "check", str(path)]) == 0
    assert "ok: t" in capsys.readouterr().out
    kafka = load_spec(path).kafka
    env = {"PW_LOADER": "pw-l", "PW_CONSTRUCTOR": "pw-c", "PW_TRAINER": "pw-t"}
    loader = kafka.client_config(environ=env, role="loader", source="a")
    assert loader == {"metadata.recovery.strategy": "none", **SECURE, "sasl.username": "t-loader"} | {
        "sasl.password": "pw-l",
        "bootstrap.servers": "k:1",
    }
    assert kafka.client_config(environ=env, role="loader", source="b")["sasl.password"] == "pw-b"
    assert kafka.client_config(environ=env, role="loader", source="b")["sasl.username"] == "t-loader-b"
    assert kafka.client_config(environ=env, role="constructor")["sasl.username"] == "t-constructor"
    observer = kafka.client_config(environ=env, role="observer")  # no principal: the job's config alone
    assert "sasl.username" not in observer and observer["security.protocol"] == "SASL_SSL"
    assert kafka.client_config(environ={}) == kafka.client_config(environ={}, role="operator")
    with pytest.raises(ValueError, match="unknown role"):
        kafka.client_config(environ=env, role="admin")


def test_an_unresolvable_reference_names_the_setting_and_the_reference(tmp_path: Path) -> None:
    kafka = load_spec(_secured(tmp_path)).kafka
    with pytest.raises(MixflowError) as info:
        kafka.client_config(environ={}, role="constructor")
    assert str(info.value) == (
        "kafka.principals.constructor sasl.password: {env: PW_CONSTRUCTOR}: "
        "the environment variable PW_CONSTRUCTOR is not set"
    )
    with pytest.raises(MixflowError) as info:
        kafka.client_config(environ={}, role="loader", source="b")
    assert str(info.value).startswith(f"kafka.principals.loader.b sasl.password: {{file: {tmp_path}/b.secret}}: ")
    assert "cannot read the file: No such file or directory" in str(info.value)


def test_the_trainer_side_reads_the_trainer_principal(tmp_path: Path) -> None:
    path = _secured(tmp_path)
    source = SinkSource.from_spec(path, environ={"PW_TRAINER": SENTINEL})
    assert source.kafka_config == {**SECURE, "sasl.username": "t-trainer", "sasl.password": SENTINEL} | {
        "bootstrap.servers": "k:1"
    }
    with pytest.raises(MixflowError, match=r"kafka.principals.trainer sasl.password: \{env: PW_TRAINER\}: the env"):
        SinkSource.from_spec(path, environ={})
    spec = _base({"config": {"sasl.password": SENTINEL}})
    with pytest.raises(MixflowError) as info:
        SinkSource.from_spec(_write(tmp_path, spec), environ={})
    assert "kafka.config sasl.password: a secret must not be written in the spec" in str(info.value)
    assert SENTINEL not in str(info.value)


def test_the_spec_keeps_references_when_dumped(tmp_path: Path) -> None:
    spec = load_spec(_secured(tmp_path))
    body = spec.model_dump(mode="json")
    assert body["kafka"]["principals"]["trainer"]["sasl.password"] == {"env": "PW_TRAINER"}


_keys = st.text(string.ascii_lowercase + ".", min_size=1, max_size=20).filter(lambda k: not k.startswith("."))
_secrets = st.text(string.ascii_letters + string.digits + "!#%&*+-", min_size=8, max_size=30)


@given(st.dictionaries(_keys, st.one_of(st.text(max_size=10), st.integers(), st.booleans()), max_size=5), _secrets)
def test_no_problem_or_error_or_redaction_shows_a_secret(settings: dict, secret: str) -> None:
    settings = {k: v for k, v in settings.items() if not is_secret_key(k) and v != secret}
    with_secret = {**settings, "sasl.password": secret, "ssl.key.password": secret}
    problems = setting_problems(with_secret)
    assert sorted(k for k, _ in problems) == ["sasl.password", "ssl.key.password"]
    assert all(secret not in message for _, message in problems)
    assert secret not in str(redacted(with_secret))
    with pytest.raises(MixflowError) as info:
        resolve_settings(with_secret)
    assert secret not in str(info.value)
    referenced = {**settings, "sasl.password": {"env": "S"}}
    assert resolve_settings(referenced, environ={"S": secret}) == {**settings, "sasl.password": secret}
    assert redacted(referenced)["sasl.password"] == "{env: S}"
