"""The job spec: the example loads, and every kind of mistake is named by field path, value and file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.spec import OnExhausted, ReaderKind, SpecError, load_spec, spec_json_schema
from pipeline.tools.run.job import job_spec_file

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "example.yaml"


def _base() -> dict:
    return {
        "job": "t",
        "tokenizer": "tok.json",
        "sources": [
            {"name": "a", "reader": "jsonl", "path": "data/a"},
            {"name": "b", "reader": "text", "path": "/abs/b"},
        ],
        "mixture": {"weights": {"a": 1, "b": 3}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 10.0},
    }


def _write(tmp_path: Path, spec: dict | str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False))
    return path


def _problems(tmp_path: Path, spec: dict | str) -> list[str]:
    path = _write(tmp_path, spec)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert all(p.file == str(path) for p in info.value.problems)
    text = str(info.value)
    assert text.count("\n") == len(info.value.problems)  # a header line, then one line per problem
    return [str(p) for p in info.value.problems]


def test_example_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert spec.job == "example"
    assert spec.source_names == ["code", "docstrings", "topics"]
    code, docstrings, topics = spec.sources
    assert code.reader is ReaderKind.PARQUET and code.glob == "**/*.parquet"
    assert topics.field is None and topics.glob == "**/*.{txt,txt.gz,txt.zst,txt.zstd}"
    assert code.path == EXAMPLE.parent / "data" / "code"
    assert docstrings.tokenizer == EXAMPLE.parent / "data" / "tokenizer.json"  # job-level default
    assert spec.step.tokens_per_step == 2 * 2 * 1024
    assert spec.on_exhausted is OnExhausted.RENORMALIZE and spec.seed == 1234
    assert spec.cost.alpha_beta() == (4 * 1024 * 16 / 2, 24 * 1024**2 * 16)


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, _base()))
    a, b = spec.sources
    assert a.path == tmp_path / "data" / "a" and a.tokenizer == tmp_path / "tok.json"
    assert b.path == Path("/abs/b")
    assert a.field == "text" and a.max_sample_length == 1024 and a.epochs == 1 and a.loaders == 1
    assert spec.mixture.points() == [(0, {"a": 0.25, "b": 0.75})]
    assert spec.on_exhausted is OnExhausted.STOP


def test_kafka_config_precedence(tmp_path: Path) -> None:
    spec = _base() | {"kafka": {"bootstrap_servers": "k:1", "config": {"security.protocol": "SSL", "x": 3}}}
    kafka = load_spec(_write(tmp_path, spec)).kafka
    expected = {"metadata.recovery.strategy": "none", "security.protocol": "SSL", "x": 3, "bootstrap.servers": "k:1"}
    assert kafka.client_config(environ={}) == expected
    spec["kafka"]["config"]["metadata.recovery.strategy"] = "rebootstrap"  # the spec's config wins
    kafka = load_spec(_write(tmp_path, spec)).kafka
    assert kafka.client_config(environ={})["metadata.recovery.strategy"] == "rebootstrap"
    assert kafka.resolved_bootstrap_servers(environ={"KAFKA_BOOTSTRAP_SERVERS": "env:2"}) == "env:2"
    assert kafka.resolved_bootstrap_servers("cli:3", environ={"KAFKA_BOOTSTRAP_SERVERS": "env:2"}) == "cli:3"


def test_field_errors_all_at_once(tmp_path: Path) -> None:
    spec = _base()
    spec["job"] = "my.job"
    spec["sources"][0]["feild"] = "body"
    spec["sources"][1]["reader"] = "csv"
    spec["step"]["ranks"] = 0
    spec["cost"] = {"alpha": 1.0, "hidden_size": 8}
    problems = _problems(tmp_path, spec)
    assert len(problems) == 5
    joined = "\n".join(problems)
    assert "job: " in joined and "'my.job'" in joined
    assert "sources[0].feild: unknown key (did you mean 'field'?)" in joined
    reader_kinds = "'jsonl', 'parquet', 'arrow', 'text' or 'webdataset'"
    assert f"sources[1].reader: Input should be {reader_kinds} (got 'csv')" in joined
    assert "step.ranks:" in joined and "(got 0)" in joined
    assert "cost: give either alpha/beta or hidden_size/num_layers/causal" in joined


def test_cross_field_errors_name_their_field(tmp_path: Path) -> None:
    spec = _base()
    del spec["tokenizer"]
    spec["sources"][0]["max_sample_length"] = 4096
    spec["sources"].append({"name": "c", "reader": "parquet", "path": "c", "pretokenized": True})
    spec["mixture"] = {
        "interpolation": "linear",
        "schedule": [{"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 10, "weights": {"a": 1, "code": 2}}],
    }
    problems = "\n".join(_problems(tmp_path, spec))
    assert "sources[0].tokenizer: required unless pretokenized" in problems
    assert "sources[1].tokenizer" in problems and "sources[2].tokenizer" not in problems
    assert "sources[0].max_sample_length: must be at most step.tokens_per_micro_batch (1024) (got 4096)" in problems
    assert "mixture.schedule[1].weights.code: not a source of this job" in problems
    assert "sources[2].name: has no weight above 0 anywhere in mixture" in problems


@pytest.mark.parametrize(
    ("mixture", "expected"),
    [
        ({"weights": {"a": 0, "b": 0}}, "mixture.weights: the shares must sum to more than 0"),
        ({"weights": {"a": -1, "b": 1}}, "mixture.weights.a: Input should be greater than or equal to 0 (got -1)"),
        ({"weights": {"a": 1, "b": 1}, "interpolation": "linear"}, "mixture.interpolation: interpolation applies"),
        ({}, "mixture: give exactly one of 'weights' (fixed) or 'schedule' (curriculum), not neither"),
        ({"schedule": [{"step": 5, "weights": {"a": 1, "b": 1}}]}, "mixture.schedule[0].step: the first"),
        (
            {"schedule": [{"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 0, "weights": {"a": 1, "b": 1}}]},
            "mixture.schedule[1].step: steps must strictly increase",
        ),
        (
            {"schedule": [{"step": 0, "weights": {"a": 1, "b": 1}}], "interpolation": "cubic"},
            "mixture.interpolation: Input should be 'constant' or 'linear' (got 'cubic')",
        ),
    ],
)
def test_mixture_errors(tmp_path: Path, mixture: dict, expected: str) -> None:
    spec = _base() | {"mixture": mixture}
    assert any(expected in p for p in _problems(tmp_path, spec)), expected


def test_source_and_long_context_errors(tmp_path: Path) -> None:
    spec = _base()
    spec["sources"][1] |= {"field": "body", "pretokenized": True, "epochs": 0}
    spec["sources"].append({"name": "a", "reader": "arrow", "path": "x"})
    problems = "\n".join(_problems(tmp_path, spec))
    assert "sources[1].epochs" in problems and "sources[2].name" not in problems  # field phase first

    spec["sources"][1] = {"name": "b", "reader": "text", "path": "b", "field": "body", "pretokenized": True}
    problems = "\n".join(_problems(tmp_path, spec))
    assert "sources[1].field: the text reader has no fields; remove it (got 'body')" in problems
    assert "sources[1].pretokenized: the text reader reads text, not token ids" in problems

    spec["sources"][1] = {"name": "b", "reader": "text", "path": "b"}
    problems = "\n".join(_problems(tmp_path, spec))
    assert "sources[2].name: duplicate source name (also sources[0]) (got 'a')" in problems

    spec = _base() | {"long_context": {"min_length": 2000, "token_share": 0.2}}
    assert "long_context.min_length: no source can have a sample this long" in "\n".join(_problems(tmp_path, spec))
    spec["long_context"] = {"min_length": 512, "token_share": 1.5}
    assert "long_context.token_share:" in "\n".join(_problems(tmp_path, spec))
    spec["long_context"]["token_share"] = 0.5
    spec["sources"][1]["max_sample_length"] = 256  # only a can be long, and a holds 1/4 of the tokens
    assert "mixture.weights: the sources that can have long samples (a) hold 0.25" in "\n".join(
        _problems(tmp_path, spec)
    )


def test_problem_lines_point_into_the_file(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("reader: jsonl ", "reader: jsnl ")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "jsnl" in s)
    (problem,) = _problems(tmp_path, text)
    assert problem.startswith(f"{tmp_path / 'job.yaml'}:{line}: sources[1].reader:")


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path, "job: x\nsources:\n  - name: a\n   reader: jsonl\n")
    assert problem.startswith(f"{tmp_path / 'job.yaml'}:4: (yaml): invalid YAML")
    (problem,) = _problems(tmp_path, "- just\n- a list\n")
    assert "expected a mapping" in problem


def test_duplicate_keys_are_reported(tmp_path: Path) -> None:
    text = yaml.safe_dump(_base(), sort_keys=False) + "seed: 1\nseed: 2\n"
    (problem,) = _problems(tmp_path, text)
    assert "seed: key given twice" in problem


def test_json_schema() -> None:
    schema = spec_json_schema()
    assert {"job", "sources", "mixture", "step", "cost"} <= set(schema["required"])
    json.dumps(schema)
    assert "jsonl" in json.dumps(schema)


def test_cli_check_and_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "check", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.startswith("ok: example (3 sources,")
    bad = _base() | {"seed": -1}
    assert main(["spec", "check", str(_write(tmp_path, bad))]) == 2
    assert "seed: Input should be greater than or equal to 0 (got -1)" in capsys.readouterr().err
    assert main(["spec", "check", "--files", str(_write(tmp_path, _base()))]) == 2
    assert "sources[0].path: no such folder" in capsys.readouterr().err
    out = tmp_path / "schema.json"
    assert main(["spec", "schema", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == spec_json_schema()


@pytest.mark.parametrize("composition", [None, {"window_steps": 2.0}])
def test_a_renamed_job_keeps_every_field_the_spec_set(tmp_path: Path, composition: object) -> None:
    """``mixflow run --job`` writes the spec again under another job name: the roles read that copy, so it
    must mean what the original means, a field set to null included (``composition: null`` is the
    in-order draw; dropped, it would fall back to the default composition)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["composition"] = composition
    original = tmp_path / "spec.yaml"
    original.write_text(yaml.safe_dump(body))
    spec, path = job_spec_file(original, "renamed", tmp_path / "run")
    assert spec.job == "renamed"
    assert load_spec(path).model_dump() == {**load_spec(original).model_dump(), "job": "renamed"}
    assert (spec.composition is None) == (composition is None)
