"""A trainer principal per data-parallel rank: ``{rank}`` in ``kafka.principals.trainer`` is replaced with the
rank's number where a rank's settings are built (the roles' side and the trainer's alike), before references are
resolved; ``{rank}`` anywhere else, or any other placeholder, is refused by the spec's check in one line naming
the setting."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.spec import SpecError, load_spec
from tests.test_secrets import SECURE, SENTINEL, _base, _principal, _write
from topics.errors import MixflowError
from topics.kafka.rank_principals import for_rank, names_rank, placeholder_problems
from trainer_sink.config import SinkSource

PER_RANK = {"sasl.username": "t-trainer-{rank}", "sasl.password": {"env": "PW_TRAINER_{rank}"}}


def _per_rank_spec(tmp_path: Path, trainer: dict | None = None, **principals: dict) -> Path:
    every = {"loader": _principal("t-loader", "PW_LOADER"), "trainer": trainer or PER_RANK, **principals}
    return _write(tmp_path, _base({"bootstrap_servers": "k:1", "config": SECURE, "principals": every}))


@pytest.mark.parametrize("rank", [0, 1, 7, 1023])
def test_each_rank_gets_its_own_principal_on_both_sides(tmp_path: Path, rank: int) -> None:
    path = _per_rank_spec(tmp_path)
    environ = {f"PW_TRAINER_{r}": f"{SENTINEL}-{r}" for r in (0, 1, 7, 1023)}
    expected = {**SECURE, "sasl.username": f"t-trainer-{rank}", "sasl.password": f"{SENTINEL}-{rank}"}
    assert SinkSource.from_spec(path, environ=environ, rank=rank).kafka_config == expected | {
        "bootstrap.servers": "k:1"
    }
    config = load_spec(path).kafka.client_config(environ=environ, role="trainer", rank=rank)
    assert {k: config[k] for k in expected} == expected
    # The other roles are as they were: no rank, no placeholder.
    loader = load_spec(path).kafka.client_config(environ={"PW_LOADER": "l"}, role="loader", source="a")
    assert loader["sasl.username"] == "t-loader"


def test_a_file_reference_and_a_certificate_path_name_the_rank(tmp_path: Path) -> None:
    trainer = {
        "ssl.certificate.location": str(tmp_path / "t-{rank}.pem"),
        "ssl.key.password": {"file": str(tmp_path / "k-{rank}")},
    }
    path = _per_rank_spec(tmp_path, trainer)
    (tmp_path / "k-3").write_text("key-password-3\n")
    config = SinkSource.from_spec(path, environ={}, rank=3, bootstrap_servers="k:2").kafka_config
    assert config["ssl.certificate.location"] == str(tmp_path / "t-3.pem")
    with pytest.raises(MixflowError, match=r"kafka.principals.trainer ssl.key.password: \{file: .*/k-2\}: cannot read"):
        SinkSource.from_spec(path, environ={}, rank=2)


def test_without_a_rank_the_per_rank_settings_are_refused_naming_them(tmp_path: Path) -> None:
    path = _per_rank_spec(tmp_path)
    expected = r"^kafka.principals.trainer names \{rank\}: only a rank's trainer"
    with pytest.raises(MixflowError, match=expected):
        SinkSource.from_spec(path, environ={"PW_TRAINER_0": "x"})
    with pytest.raises(MixflowError, match=expected):
        load_spec(path).kafka.client_config(environ={"PW_TRAINER_0": "x"}, role="trainer")
    with pytest.raises(MixflowError, match=r"PW_TRAINER_1 is not set"):
        SinkSource.from_spec(path, environ={"PW_TRAINER_0": "x"}, rank=1)


MISPLACED = [
    ({"loader": {"sasl.username": "t-loader-{rank}"}}, "kafka.principals.loader['sasl.username']", "only"),
    ({"observer": {"sasl.password": {"env": "PW_{rank}"}}}, "kafka.principals.observer['sasl.password']", "only"),
    ({"config": {"sasl.username": "u-{rank}"}}, "kafka.config['sasl.username']", "only"),
    ({"trainer": {"sasl.username": "t-{node}-{rank}"}}, "kafka.principals.trainer['sasl.username']", "{node}"),
    ({"trainer": {"sasl.password": {"env": "PW_{RANK}"}}}, "kafka.principals.trainer['sasl.password']", "{RANK}"),
    ({"loader.b": {"ssl.key.location": "/k/{source}.key"}}, "kafka.principals['loader.b']['ssl.key.location']", "{s"),
]


@pytest.mark.parametrize(("where", "named", "says"), MISPLACED)
def test_a_misplaced_or_unknown_placeholder_is_a_spec_error_naming_the_setting(
    tmp_path: Path, where: dict, named: str, says: str, capsys
) -> None:
    kafka = {"config": {**SECURE, **where.pop("config", {})}, "principals": where}
    path = _write(tmp_path, _base(kafka))
    assert main(["spec", "check", str(path)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if named in line]
    assert len(lines) == 1, lines
    assert ("{rank} is replaced only in kafka.principals.trainer" if says == "only" else "unknown placeholder") in (
        lines[0]
    )
    assert says == "only" or f"unknown placeholder {says}" in lines[0]
    with pytest.raises(SpecError):
        load_spec(path)


@pytest.mark.parametrize(
    ("kafka", "said"),
    [
        ({"config": {"sasl.username": "u-{rank}"}}, "kafka.config sasl.username: {rank} is replaced only in"),
        ({"principals": {"trainer": {"sasl.username": "t-{r}"}}}, "kafka.principals.trainer sasl.username: unknown"),
    ],
)
def test_the_trainer_side_refuses_a_misplaced_placeholder_in_one_line(tmp_path: Path, kafka: dict, said: str) -> None:
    with pytest.raises(MixflowError) as info:
        SinkSource.from_spec(_write(tmp_path, _base(kafka)), environ={}, rank=0)
    assert said in str(info.value) and "\n" not in str(info.value)


_plain = st.text(string.ascii_letters + string.digits + "-_/.", max_size=8)
_unknown = st.sampled_from(["{node}", "{RANK}", "{rank_id}", "{source}", "{r}"])
_pieces = st.lists(st.one_of(_plain, st.just("{rank}"), _unknown, st.just("{}"), st.just("{ rank }")), max_size=5)
_keys = st.sampled_from(["sasl.username", "sasl.password", "ssl.certificate.location", "client.id"])


@given(st.dictionaries(_keys, st.tuples(_pieces, st.booleans())), st.sampled_from(["trainer", "loader", None]))
def test_placeholders_are_checked_and_replaced_exactly(drawn: dict, key: str | None) -> None:
    """Values built from pieces (text, ``{rank}``, an unknown ``{name}``, braces that are no placeholder), as
    themselves or as an ``{env: ...}`` reference: a setting is refused exactly when it holds an unknown
    placeholder, or ``{rank}`` outside the trainer's; the trainer's rank settings have ``{rank}`` replaced, and
    nothing else changed."""
    settings = {k: ("".join(p) if not ref else {"env": "".join(p)}) for k, (p, ref) in drawn.items()}
    unknown = {
        k
        for k, (pieces, _) in drawn.items()
        if any(p.startswith("{") and p[1:-1].isidentifier() and p != "{rank}" for p in pieces)
    }
    ranked = {k for k, (pieces, _) in drawn.items() if "{rank}" in pieces}
    refused = unknown | (ranked if key != "trainer" else set())
    assert {k for k, _ in placeholder_problems(settings, key)} == refused
    assert names_rank(settings) == bool(ranked)
    for rank in (0, 3, 4095):
        replaced = for_rank(settings, rank)
        expected = {
            k: (
                "".join(p).replace("{rank}", str(rank)) if not ref else {"env": "".join(p).replace("{rank}", str(rank))}
            )
            for k, (p, ref) in drawn.items()
        }
        assert replaced == expected
