"""`mixflow deploy render`: the job's Kubernetes objects, validated offline (no cluster runs here).

Core objects against the Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: unknown
fields refused), KEDA ScaledObjects against deploy/schemas/, and the links between objects checked
both by ``check_links`` and here, from the outside, over families of job specs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipeline.cli import build_parser, main
from pipeline.spec import load_spec
from pipeline.tools.deploy import DeployOptions, check_links, render_job
from pipeline.tools.deploy.manifests import DESIRED_LOADERS_METRIC, POD_INDEX_LABEL
from pipeline.tools.deploy.write import dump

REPO = Path(__file__).resolve().parent.parent
KEDA_SCHEMA = json.loads((REPO / "deploy" / "schemas" / "keda-scaledobject-v1alpha1.schema.json").read_text())
jsonschema.Draft202012Validator.check_schema(KEDA_SCHEMA)
KEDA = jsonschema.Draft202012Validator(KEDA_SCHEMA)
KUBERNETES_VERSION = "1.30.0"  # StatefulSet pods carry their ordinal as a label since 1.28


def validate(obj: dict) -> None:
    """Raise when ``obj`` is not a valid object of its kind (after a YAML round trip, as kubectl reads it)."""
    obj = yaml.safe_load(dump(obj))
    if obj["kind"] == "ScaledObject":
        KEDA.validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def write_spec(folder: Path, spec: dict) -> Path:
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


names = st.from_regex(r"[a-z][a-z0-9_-]{0,10}[a-z0-9]", fullmatch=True)


@st.composite
def job_specs(draw: st.DrawFn) -> dict:
    sources = draw(st.lists(names, min_size=1, max_size=4, unique_by=lambda n: n.replace("_", "-")))
    autoscaling = draw(st.booleans())
    entries = []
    for name in sources:
        entry: dict = {"name": name, "reader": "jsonl", "path": draw(st.sampled_from([f"d/{name}", "/abs/x"]))}
        low, high = draw(st.integers(1, 3)), draw(st.integers(3, 8))
        entry["loaders"] = draw(st.integers(low, high))
        if draw(st.booleans()):
            entry["autoscale"] = {"min": low, "max": high}
        if draw(st.booleans()):
            entry["unit_target_s"] = draw(st.sampled_from([0.1, 0.5, 2.0]))
        entries.append(entry)
    return {
        "job": draw(names),
        "tokenizer": "tok/tokenizer.json",
        "sources": entries,
        "mixture": {"weights": {name: 1 for name in sources}},
        "step": {"ranks": draw(st.integers(1, 4)), "micro_batches": 1, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "autoscaling": {"enabled": autoscaling},
        "constructor": {"lanes": draw(st.integers(1, 3))},
    }


options = st.builds(
    DeployOptions,
    image=st.sampled_from(["mixflow:latest", "registry.example/ml/mixflow:1.2.3"]),
    namespace=st.sampled_from(["default", "ml-data"]),
    bootstrap_servers=st.sampled_from([None, "kafka.kafka.svc:9092"]),
    data_claim=st.sampled_from([None, "corpus"]),
    data_mount=st.sampled_from(["/data", "/mnt/corpus"]),
)


@given(job_specs(), options)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example loads and validates a dozen objects
)
def test_rendered_objects_are_valid_and_fit_the_job(tmp_path: Path, raw: dict, deploy: DeployOptions) -> None:
    spec_path = write_spec(tmp_path, raw)
    spec = load_spec(spec_path)
    objects = render_job(spec, spec_path.read_text(), deploy)
    for obj in objects:
        validate(obj)
    assert check_links(objects) == []

    by_kind: dict[str, dict[str, dict]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
        assert obj["metadata"]["namespace"] == deploy.namespace
    config_map = next(iter(by_kind["ConfigMap"].values()))
    loaders = {_arg(s, "--source"): s for s in by_kind["StatefulSet"].values()}
    assert sorted(loaders) == sorted(spec.source_names), "one StatefulSet of loaders per source"
    in_cluster = None
    for source, stateful_set in loaders.items():
        assert stateful_set["spec"]["replicas"] == spec.source(source).loaders
        pod = stateful_set["spec"]["template"]
        assert stateful_set["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        container = pod["spec"]["containers"][0]
        assert container["image"] == deploy.image and container["args"][0] == "load"
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env[_arg(stateful_set, "--instance").strip("$()")] == f"metadata.labels['{POD_INDEX_LABEL}']"
        assert (_arg(stateful_set, "--bootstrap-servers") or None) == deploy.bootstrap_servers
        # The spec the command reads is the ConfigMap's, and it is the job's spec with paths on the data volume.
        spec_file = Path(_arg(stateful_set, "--spec"))
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(spec_file.parent))
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
        data = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
        assert data["persistentVolumeClaim"]["claimName"] == (deploy.data_claim or f"{spec.job}-data".replace("_", "-"))
        assert any(m["mountPath"] == deploy.data_mount for m in container["volumeMounts"])
        if in_cluster is None:
            (tmp_path / "cluster").mkdir(exist_ok=True)
            in_cluster = load_spec(write_spec(tmp_path / "cluster", yaml.safe_load(config_map["data"][spec_file.name])))
            assert in_cluster.tokenizer == Path(deploy.data_mount) / raw["tokenizer"]
            unmoved = {"sources", "tokenizer"}
            assert in_cluster.model_dump(exclude=unmoved) == spec.model_dump(exclude=unmoved)
        given = raw_path(raw, source)
        expected = Path(given) if given.startswith("/") else Path(deploy.data_mount) / given
        assert in_cluster.source(source).path == expected

    constructors = by_kind["Deployment"]
    lanes = sorted(int(_arg(d, "--lane")) for d in constructors.values() if _args(d)[0] == "construct")
    assert lanes == list(range(spec.constructor.lanes))
    assert all(d["spec"]["replicas"] == 2 for d in constructors.values() if _args(d)[0] == "construct")

    autoscalers = [d for d in constructors.values() if _args(d)[0] == "autoscale"]
    scaled = by_kind.get("ScaledObject", {})
    if not spec.autoscaling.enabled:
        assert not autoscalers and not scaled
        return
    assert len(autoscalers) == 1 and _arg(autoscalers[0], "--metrics-port") == "9400"
    scaled_sources = {s.name for s in spec.sources if s.autoscale is not None}
    assert len(scaled) == len(scaled_sources)
    for obj in scaled.values():
        target = by_kind["StatefulSet"][obj["spec"]["scaleTargetRef"]["name"]]
        assert obj["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
        source = _arg(target, "--source")
        assert source in scaled_sources
        assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == spec.source(source).loader_bounds()
        query = obj["spec"]["triggers"][0]["metadata"]["query"]
        assert DESIRED_LOADERS_METRIC in query and f'source="{source}"' in query and f'job="{spec.job}"' in query


def raw_path(raw: dict, source: str) -> str:
    return next(s["path"] for s in raw["sources"] if s["name"] == source)


def _args(workload: dict) -> list[str]:
    return workload["spec"]["template"]["spec"]["containers"][0]["args"]


def _arg(workload: dict, flag: str) -> str | None:
    args = _args(workload)
    return args[args.index(flag) + 1] if flag in args else None


@pytest.fixture
def example_objects() -> list[dict]:
    spec_path = REPO / "deploy" / "job.yaml"
    return render_job(load_spec(spec_path), spec_path.read_text(), DeployOptions(namespace="mixflow"))


def _first(objects: list[dict], kind: str) -> dict:
    return next(o for o in objects if o["kind"] == kind)


@pytest.mark.parametrize(
    ("breakage", "problem"),
    [
        (lambda o: _first(o, "StatefulSet")["spec"]["selector"]["matchLabels"].update(x="y"), "selector"),
        (lambda o: _first(o, "ScaledObject")["spec"]["scaleTargetRef"].update(name="nope"), "not rendered"),
        (
            lambda o: _first(o, "ScaledObject")["spec"]["triggers"][0]["metadata"].update(query="up"),
            "does not query",
        ),
        (
            lambda o: _first(o, "ScaledObject")["spec"]["triggers"][0]["metadata"].update(
                query=f'{DESIRED_LOADERS_METRIC}{{source="other"}}'
            ),
            "is not for source",
        ),
        (lambda o: _first(o, "ScaledObject")["spec"].update(minReplicaCount=0), "planner"),
        (lambda o: _first(o, "StatefulSet")["spec"]["template"]["spec"]["volumes"].pop(0), "lacks"),
        (lambda o: _first(o, "ConfigMap")["data"].clear(), "not a key"),
        (lambda o: _first(o, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"].clear(), "ordinal"),
        (lambda o: _first(o, "Service")["spec"]["selector"].update(x="y"), "matches no"),
        (lambda o: _first(o, "Service")["spec"].pop("clusterIP"), "headless"),
        (lambda o: o.append(copy.deepcopy(_first(o, "ConfigMap"))), "twice"),
    ],
)
def test_check_links_names_each_broken_reference(example_objects: list[dict], breakage, problem: str) -> None:
    assert check_links(example_objects) == []
    breakage(example_objects)
    problems = check_links(example_objects)
    assert any(problem in p for p in problems), problems


def test_the_schemas_refuse_what_a_cluster_would(example_objects: list[dict]) -> None:
    stateful_set = copy.deepcopy(_first(example_objects, "StatefulSet"))
    stateful_set["spec"]["replica"] = 2  # a typo: strict validation refuses unknown fields
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(stateful_set)
    scaled = copy.deepcopy(_first(example_objects, "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # KEDA's metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    del scaled["spec"]["scaleTargetRef"]
    with pytest.raises(jsonschema.ValidationError):
        KEDA.validate(scaled)


def test_the_committed_example_manifests_are_what_the_renderer_writes(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["deploy", "render", "--spec", str(REPO / "deploy" / "job.yaml"), "--out", str(out)]
    assert main([*argv, "--bootstrap-servers", "kafka.kafka.svc:9092", "--namespace", "mixflow"]) == 0
    committed = sorted(p.name for p in (REPO / "deploy" / "example").glob("*.yaml"))
    assert sorted(p.name for p in out.glob("*.yaml")) == committed
    for name in committed:
        assert (out / name).read_text() == (REPO / "deploy" / "example" / name).read_text(), (
            f"deploy/example/{name} is stale: render it again (the command is in deploy/job.yaml)"
        )
        validate(yaml.safe_load((out / name).read_text()))
    kinds = sorted(yaml.safe_load((out / name).read_text())["kind"] for name in committed)
    assert kinds.count("ScaledObject") == 2 and kinds.count("StatefulSet") == 3


def test_every_pod_runs_a_command_the_mixflow_cli_accepts(example_objects: list[dict]) -> None:
    """Kubernetes expands ``$(VAR)`` in args from the container's env; the rest must parse as is."""
    parser = build_parser()
    commands = set()
    for workload in (o for o in example_objects if o["kind"] in ("Deployment", "StatefulSet")):
        args = [a.replace("$(MIXFLOW_INSTANCE)", "3").replace("$(POD_NAME)", "pod-x") for a in _args(workload)]
        parsed = parser.parse_args(args)
        commands.add(parsed.command)
        assert str(parsed.spec) == "/etc/mixflow/spec.yaml"
        if parsed.command == "load":
            assert parsed.instance == 3 and parsed.source in {"code", "docstrings", "topics"}
    assert commands == {"load", "construct", "autoscale"}


def test_names_kubernetes_cannot_take_are_refused_naming_them(tmp_path: Path, capsys) -> None:
    raw = {
        "job": "j",
        "tokenizer": "t.json",
        "sources": [{"name": "a_b", "reader": "jsonl", "path": "x"}, {"name": "a-b", "reader": "jsonl", "path": "y"}],
        "mixture": {"weights": {"a_b": 1, "a-b": 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 64},
        "cost": {"alpha": 1.0, "beta": 1.0},
    }
    argv = ["deploy", "render", "--spec", str(write_spec(tmp_path, raw)), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "clashing Kubernetes names" in capsys.readouterr().err
    raw["job"] = "j" * 60
    raw["sources"], raw["mixture"] = raw["sources"][:1], {"weights": {"a_b": 1}}
    assert main(["deploy", "render", "--spec", str(write_spec(tmp_path, raw)), "--out", str(tmp_path / "o")]) == 2
    assert "shorten the job or source name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
