"""The mistakes users make, as a class: every command's arguments (bad numbers, missing and unusable paths,
unknown jobs, sources and ranks, a broker that is not there) and the sink's constructor. Each must end in one
clear line, an exit code that says which kind of failure it is (``pipeline/cli/boundary.py``), no
traceback, and no file made or changed.

The commands run in this process through the CLI's ``main``; a few run as processes, where only a real exit
code and stderr show that nothing leaks past the boundary."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import main
from tests.loader_support import REPO, write_spec
from topics.kafka.admin import ensure_job_topics

NOT_FOUND, USAGE, REFUSED, UNREACHABLE, NO_ANSWER, INTERRUPTED = 4, 2, 5, 6, 7, 130


@dataclass(frozen=True)
class Mistake:
    """``mixflow ARGV`` exits ``code`` and its stderr matches ``says``. In ARGV, ``{spec}`` is a valid spec
    of a job that has topics on the broker, ``{missing_job}`` one of a job that has none, ``{dead}`` one whose
    broker is not there; ``{file}`` an existing file, ``{tmp}`` the folder of the case, ``{dead_servers}``
    the address no broker answers at."""

    argv: str
    code: int
    says: str

    def args(self, world: dict[str, str]) -> list[str]:
        return [word.format(**world) for word in self.argv.split()]


def _case(argv: str, code: int, says: str) -> object:
    return pytest.param(Mistake(argv, code, says), id=argv.split(" --spec")[0] + f" [{says[:40]}]")


PLAN = "plan --micro-batches 1 "
WITHOUT_BROKER = [
    # spec
    _case("spec check {tmp}/none.yaml", NOT_FOUND, r"cannot read: .*No such file"),
    _case("spec check {tmp}/broken.yaml", USAGE, r"invalid YAML"),
    _case("spec schema --out {file}/schema.json", USAGE, r"argument --out: cannot write .*is a file"),
    _case("spec schema --out {tmp}", USAGE, r"argument --out: .* is a folder"),
    # plan
    _case(PLAN + "--lengths {tmp}/none.npy --ranks 2 --capacity 8 --out {tmp}/p", NOT_FOUND, "no such"),
    _case(PLAN + "--lengths {tmp}/l.npy --ranks 0 --capacity 8 --out {tmp}/p", USAGE, "--ranks: must be"),
    _case(PLAN + "--lengths {tmp}/l.npy --ranks 2 --capacity -8 --out {tmp}/p", USAGE, "above 0, not -8"),
    _case(PLAN + "--lengths {tmp}/l.npy --ranks x --capacity 8 --out {tmp}/p", USAGE, "'x' is not a whole"),
    _case(PLAN + "--lengths {tmp}/l.npy --ranks 2 --capacity 8 --out {file}/p", USAGE, "--out: cannot write"),
    # calibrate
    _case("calibrate --device cpu --repeats 0", USAGE, "--repeats must be >= 1, got 0"),
    _case("calibrate --device cpu --out {tmp}", USAGE, "--out: .* is a folder"),
    # load
    _case("load --spec {dead} --source nope", NOT_FOUND, "no source 'nope'"),
    _case("load --spec {tmp}/none.yaml --source code", NOT_FOUND, "No such file"),
    _case("load --spec {dead} --source code --instance -1", USAGE, "--instance: must be at least 0, not -1"),
    _case("load --spec {dead} --source code --unit-seconds 0", USAGE, "--unit-seconds: must be above 0"),
    _case("load --spec {dead} --source code --unit-seconds nan", USAGE, "--unit-seconds: 'nan' is not a finite number"),
    _case("load --spec {dead} --source code --max-units 0", USAGE, "--max-units: must be above 0"),
    _case("load --spec {dead} --source code --rejoin-after-s -1", USAGE, "--rejoin-after-s: must be above 0"),
    _case("load --spec {dead} --source code --session-timeout-ms 0", USAGE, "--session-timeout-ms: must be above 0"),
    _case("load --spec {dead} --source code --metrics-port 70000", USAGE, "--metrics-port: a port is 0 to 65535"),
    _case("load --spec {dead} --source code --transaction-timeout-ms 0", USAGE, "--transaction-timeout-ms: must be"),
    # construct
    _case("construct --spec {dead} --max-steps 0", USAGE, "--max-steps: must be above 0"),
    _case("construct --spec {dead} --lane -1", USAGE, "--lane: must be at least 0"),
    _case("construct --spec {dead} --lease-timeout-ms -5", USAGE, "--lease-timeout-ms: must be above 0"),
    _case("construct --spec {dead} --output-job a/b", USAGE, "--output-job: .*job"),
    _case("construct --spec {tmp}/none.yaml", NOT_FOUND, "No such file"),
    # control
    _case("control set-mixture --spec {dead} --from-step -1 code=1", USAGE, "--from-step: must be at least 0, not -1"),
    _case("control set-mixture --spec {dead} --from-step 1 --wait-s -1 code=1", USAGE, "--wait-s: must be at least 0"),
    _case("control set-mixture --spec {dead} --from-step 1 nope=1", NOT_FOUND, "the job mixes no source 'nope'"),
    _case("control set-mixture --spec {dead} --from-step 1 code", USAGE, "give SOURCE=SHARE"),
    _case("control set-mixture --spec {dead} --from-step 1 code=-1", USAGE, "a share must be a finite number >= 0"),
    _case("control set-mixture --spec {dead} --from-step 1 code=1", UNREACHABLE, "no Kafka broker answers at"),
    # replay
    _case("replay --spec {dead} --from-step -1 --to-job x", USAGE, "--from-step: must be at least 0"),
    _case("replay --spec {dead} --from-step 0 --to-job x --ranks 0", USAGE, "--ranks: must be above 0"),
    _case("replay --spec {dead} --from-step 0 --to-job x --micro-batches -2", USAGE, "--micro-batches: must be"),
    _case("replay --spec {dead} --from-step 0 --to-job a:b", USAGE, "--to-job: .*job"),
    _case("replay --spec {dead} --from-step 0 --to-job x", UNREACHABLE, "no Kafka broker answers at"),
    # run
    _case("run --spec {dead} --shadows -1", USAGE, "--shadows: must be at least 0, not -1"),
    _case("run --spec {dead} --metrics-port-base -1", USAGE, "--metrics-port-base: a port is 0 to 65535"),
    _case("run --spec {dead} --state-dir {file}", USAGE, "--state-dir: .* is a file"),
    _case("run --spec {dead} --job a/b", USAGE, "--job: .*job"),
    _case("run --spec {dead} --trainer {{nope}}", USAGE, "bad --trainer command"),
    _case("run --spec {dead} --allow-dead-letters 5", USAGE, "--allow-dead-letters: a share is 0 to 1 .*, not 5"),
    _case("run --spec {tmp}/none.yaml", NOT_FOUND, "No such file"),
    _case("run --spec {dead} --state-dir {tmp}/state", UNREACHABLE, "no Kafka broker answers at"),
    # top
    _case("top --spec {dead} --interval 0", USAGE, "--interval: must be above 0"),
    _case("top --spec {dead} --window -1", USAGE, "--window: must be above 0"),
    _case("top --spec {dead} --run-folder {tmp}/nowhere", NOT_FOUND, "no folder"),
    _case("top --spec {dead} --json", USAGE, "give --once"),
    _case("top --spec {dead} --once", UNREACHABLE, "no Kafka broker answers at"),
    # report
    _case("report --spec {dead} --out {file}", USAGE, "--out: .* is a file, not a folder"),
    _case("report --spec {dead} --out {file}/plots", USAGE, "--out: cannot make folder .* is a file"),
    _case("report --spec {dead} --out /proc/1/plots", USAGE, "--out: cannot write in /proc/1/plots"),
    _case("report --spec {dead} --out {tmp}/plots", UNREACHABLE, "no Kafka broker answers at"),
    # topics
    _case("topics list --bootstrap-servers {dead_servers}", UNREACHABLE, "no Kafka broker answers at"),
    _case("topics delete --job a/b --bootstrap-servers {dead_servers}", USAGE, "--job: .*job"),
    # stack
    _case("stack up --brokers 0 --state-dir {tmp}/stack", USAGE, "--brokers: must be above 0"),
    _case("stack up --port 70000 --state-dir {tmp}/stack", USAGE, "--port: a port is 0 to 65535"),
    _case("stack status --state-dir {file}", USAGE, "--state-dir: .* is a file"),
    _case("stack stop-node 0", USAGE, "node: must be above 0"),
    _case("stack stop-node 1 --state-dir {tmp}/no-cluster", NOT_FOUND, "no cluster in"),
    # chaos
    _case("chaos --spec {dead} --faults -1 --seed 1", USAGE, "--faults: must be at least 0"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --shadows -1", USAGE, "--shadows: must be at least 0"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --fault-timeout-s 0", USAGE, "--fault-timeout-s: must be above 0"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --kinds nope", USAGE, "--kinds: 'nope' is not a valid"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --out {file}", USAGE, "--out: .* is a file"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --kinds restart-object-store", USAGE, "restart-object-store needs"),
    _case("chaos --spec {dead} --faults 1 --seed 1 --kinds kill-loader,kill-shadow-constructor --shadows 0", USAGE,
          "cannot inject kill-shadow-constructor needs a shadow constructor \\(--shadows 1 or more\\)$"),
    # deploy
    _case("deploy render --spec {dead} --out {file}", USAGE, "--out: .* is a file, not a folder"),
    _case("deploy render --spec {dead} --out {file}/k8s", USAGE, "--out: cannot make folder .* is a file"),
    _case("deploy render --spec {tmp}/none.yaml --out {tmp}/k8s", NOT_FOUND, "No such file"),
    _case("deploy render --spec {dead} --out {tmp}/k8s --data-mount data", USAGE, "--data-mount must be an absolute"),
    # autoscale
    _case("autoscale --spec {dead} --metrics-port -1", USAGE, "--metrics-port: a port is 0 to 65535"),
    _case("autoscale --spec {dead} --metrics-port 0 --max-total-loaders 0", USAGE, "--max-total-loaders: must be"),
    _case("autoscale --spec {dead} --metrics-port 0 --decisions 0", USAGE, "--decisions: must be above 0"),
]  # fmt: skip

AGAINST_THE_BROKER = [
    _case("control set-mixture --spec {missing_job} --from-step 1 code=1", NOT_FOUND, "does not exist at .*is wrong"),
    _case("control set-mixture --spec {spec} --from-step 1 --wait-s 0.5 code=1", NO_ANSWER, "no constructor of"),
    _case("replay --spec {missing_job} --from-step 0 --to-job x", NOT_FOUND, "does not exist at"),
    _case("replay --spec {spec} --from-step 0 --to-job x", NOT_FOUND, "has written no step"),
    _case("top --spec {missing_job} --once", NOT_FOUND, "does not exist at"),
    _case("report --spec {missing_job} --out {tmp}/plots", NOT_FOUND, "does not exist at"),
    _case("report --spec {spec} --out {tmp}/theirs", REFUSED, "holds the report of job someone-else; not overwriting"),
    _case("topics delete --job {job} --bootstrap-servers {servers} --yes", REFUSED, "is running"),
    _case("run --spec {spec} --state-dir {tmp}/state", REFUSED,
          r"job .* is running at .*: its consumer groups have members \(.*\.loaders\.code \(1 member\)\)"),
]  # fmt: skip


def _dead_servers() -> str:
    """An address where nothing listens: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files every case may name; nothing on a broker."""
    root = tmp_path_factory.mktemp("mistakes")
    dead = _dead_servers()
    (root / "file.txt").write_text("not a folder\n")
    (root / "broken.yaml").write_text("job: [unclosed\n")
    (root / "theirs").mkdir()
    (root / "theirs" / "report.md").write_text("# Job `someone-else`\n")
    import numpy as np

    np.save(root / "l.npy", np.array([3, 5], np.int64))
    spec = write_spec(root, "mistakes-dead", dead, root / "no-data")
    return {"tmp": str(root), "file": str(root / "file.txt"), "dead": str(spec), "dead_servers": dead}


@pytest.fixture(scope="module")
def world(offline: dict[str, str], kafka_bootstrap: str) -> Iterator[dict[str, str]]:
    """``offline``, and a job with topics on the broker (and a member in one of its groups: running)."""
    from confluent_kafka import Consumer

    root = Path(offline["tmp"])
    job = f"mistakes-{os.getpid()}-{os.urandom(3).hex()}"
    ensure_job_topics(kafka_bootstrap, job, ["code", "docstrings", "topics"], 2)
    folder = root / "present"
    folder.mkdir()
    missing = root / "missing"
    missing.mkdir()
    member = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{job}.loaders.code"})
    member.subscribe([f"{job}.work.code"])
    while not member.assignment():
        member.poll(0.2)  # joining the group: its assignment is what the delete command sees
    try:
        yield {
            **offline,
            "spec": str(write_spec(folder, job, kafka_bootstrap, root / "no-data")),
            "missing_job": str(write_spec(missing, f"{job}-none", kafka_bootstrap, root / "no-data")),
            "job": job,
            "servers": kafka_bootstrap,
        }
    finally:
        member.close()


def _check(mistake: Mistake, world: dict[str, str], capsys: pytest.CaptureFixture, monkeypatch) -> None:
    root = Path(world["tmp"])
    monkeypatch.chdir(root)  # a file made by mistake in the working folder shows up in the snapshot
    monkeypatch.setenv("MIXFLOW_STATE_DIR", str(root / "state"))
    # It comes before a spec's address: the offline cases' broker is the one that is not there.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", world.get("servers", world["dead_servers"]))
    before = _files(root)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(mistake.args(world))
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    out, err = capsys.readouterr()
    said = f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert code == mistake.code, said
    assert re.search(mistake.says, err), said
    assert "Traceback" not in out + err, said
    assert _files(root) == before, f"files were made or changed:\n{said}"


@pytest.mark.parametrize("mistake", WITHOUT_BROKER)
def test_a_mistake_gets_one_line_and_the_exit_code_of_its_kind(
    mistake: Mistake, offline: dict[str, str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(mistake, offline, capsys, monkeypatch)


@pytest.mark.parametrize("mistake", AGAINST_THE_BROKER)
def test_a_mistake_about_a_job_gets_one_line_and_the_exit_code_of_its_kind(
    mistake: Mistake, world: dict[str, str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(mistake, world, capsys, monkeypatch)


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ("control set-mixture --spec {dead} --from-step -1 code=1", USAGE, "--from-step: must be at least 0"),
        ("deploy render --spec {dead} --out {file}", USAGE, "is a file, not a folder"),
        ("report --spec {dead} --out {tmp}/plots", UNREACHABLE, "no Kafka broker answers at"),
    ],
)
def test_as_a_process_a_mistake_shows_no_traceback_and_exits_by_its_kind(
    argv: str, code: int, says: str, offline: dict[str, str]
) -> None:
    args = Mistake(argv, code, says).args(offline)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": offline["dead_servers"], "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120, env=env
    )
    assert done.returncode == code, done.stderr
    assert re.search(says, done.stderr) and "Traceback" not in done.stderr, done.stderr
    assert "FAIL" not in done.stderr, "librdkafka's own lines reached the user"


def test_with_v_a_mistake_shows_its_traceback(offline: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    assert main(["-v", "stack", "stop-node", "1", "--state-dir", f"{offline['tmp']}/no-cluster"]) == NOT_FOUND
    err = capsys.readouterr().err
    assert (
        "Traceback" in err
        and "NotFoundError" in err
        and err.rstrip().endswith("--state-dir " + offline["tmp"] + "/no-cluster`")
    )


# -- the sink's constructor -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("made_with", "error", "says"),
    [
        ({"job": "{job}-none"}, "NotFoundError", r"job '.*-none' does not exist at .*name is wrong"),
        ({"job": "{job}", "rank": 2}, "NotFoundError", r"has 2 ranks at .*\.rank\.1\): there is no rank 2"),
        (
            {"job": "{job}", "bootstrap_servers": "{dead_servers}"},
            "BrokerUnreachableError",
            "no Kafka broker answers at",
        ),
        ({"spec": "{tmp}/none.yaml"}, "MixflowError", "cannot read the job spec"),
        ({"spec": "{spec}", "rank": 2}, "MixflowError", r"rank 2 is not below the job's step.ranks \(2\)"),
        ({"job": "{job}", "rank": -1}, "MixflowError", "rank must be a non-negative int"),
        ({"job": "a/b"}, "InvalidNameError", "job"),
    ],
)
def test_the_sink_refuses_at_once_what_cannot_come(
    made_with: dict[str, object], error: str, says: str, world: dict[str, str], capfd: pytest.CaptureFixture
) -> None:
    torch = pytest.importorskip("torch")  # noqa: F841 - the sink's one extra dependency
    from topics.errors import MixflowError
    from trainer_sink import KafkaBatchDataset

    kwargs = {key: value.format(**world) if isinstance(value, str) else value for key, value in made_with.items()}
    kwargs.setdefault("rank", 0)
    if "spec" not in kwargs:
        kwargs.setdefault("bootstrap_servers", world["servers"])
    with pytest.raises(MixflowError, match=says) as raised:
        KafkaBatchDataset(**kwargs)  # type: ignore[arg-type]
    assert type(raised.value).__name__ == error
    assert "FAIL" not in capfd.readouterr().err, "librdkafka's own lines reached the trainer's stderr"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"pad_to_multiple_of": 0}, "pad_to_multiple_of must be at least 1, got 0"),
        ({"pad_to_multiple_of": -64}, "pad_to_multiple_of must be at least 1, got -64"),
        ({"layout": "rows"}, "layout must be one of packed, padded, not 'rows'"),
    ],
)
def test_read_options_refuse_what_no_sink_can_read_by(options: dict[str, object], says: str) -> None:
    pytest.importorskip("torch")
    from topics.errors import MixflowError
    from trainer_sink import ReadOptions

    with pytest.raises(MixflowError, match=says):
        ReadOptions(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("vision", [{}, {"patch_size": 16}, {"patch_size": 14, "temporal_patch_size": 1}])
def test_the_sink_refuses_pixel_options_that_are_not_the_jobs_and_takes_the_jobs_by_default(
    vision: dict[str, int], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    import yaml

    from topics.errors import MixflowError
    from trainer_sink import KafkaBatchDataset, ReadOptions
    from trainer_sink.config import SinkSource
    from trainer_sink.vlm.qwen2_vl import PixelOptions

    body = {"job": "vl", "kafka": {"bootstrap_servers": _dead_servers()}, "step": {"ranks": 1}}
    body["sources"] = [{"name": "text"}, {"name": "pairs", "vision": {"image_token_id": 9, **vision}}]
    (spec := tmp_path / "spec.yaml").write_text(yaml.safe_dump(body))
    patch, temporal = vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    source = SinkSource.from_spec(spec)
    assert source.pixel_options(None) == PixelOptions(patch_size=patch, temporal_patch_size=temporal)
    mine = PixelOptions(image_mean=(0.5,) * 3, patch_size=patch, temporal_patch_size=temporal)
    assert source.pixel_options(mine) is mine
    for other in (
        PixelOptions(patch_size=patch + 2, temporal_patch_size=temporal),
        PixelOptions(patch_size=patch, temporal_patch_size=temporal + 1),
    ):
        with pytest.raises(
            MixflowError, match=rf"differ from the job vl's vision sections \(patch_size {patch}, "
        ) as raised:
            KafkaBatchDataset(
                spec, rank=0, read=ReadOptions(pixels=other)
            )  # refused before the broker is asked anything
        assert "\n" not in str(raised.value)
    body["sources"].append({"name": "clips", "vision": {"patch_size": patch + 2}})
    (spec := tmp_path / "two.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(MixflowError, match="cut media into patches of several sizes"):
        KafkaBatchDataset(spec, rank=0)


# -- what must never be harmed ----------------------------------------------------------------------------


def _deploy_spec(folder: Path, job: str, sources: int = 3) -> Path:
    import yaml

    path = write_spec(folder, job, "kafka:9092", folder / "data")
    body = yaml.safe_load(path.read_text())
    body["sources"] = body["sources"][:sources]
    body["mixture"] = {"weights": {s["name"]: 1 for s in body["sources"]}}
    (spec := folder / f"{job}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return spec


def test_deploy_render_overwrites_and_removes_only_the_same_jobs_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "k8s"
    alpha, beta = _deploy_spec(tmp_path, "alpha"), _deploy_spec(tmp_path, "beta")
    assert main(["deploy", "render", "--spec", str(alpha), "--out", str(out)]) == 0
    theirs = {  # what the folder holds besides: files it cannot tell the job of stay as they are
        "empty.yaml": "",
        "broken.yaml": "kind: [unclosed\n",
        "several.yaml": "kind: ConfigMap\nmetadata: {labels: {app.kubernetes.io/name: mixflow}}\n---\nkind: Secret\n",
        "other-app.yml": "kind: Service\nmetadata: {name: web, labels: {app.kubernetes.io/name: web}}\n",
        "notes.txt": "kubectl apply -f .\n",
    }
    for name, text in theirs.items():
        (out / name).write_text(text)
    alphas = _files(out)
    capsys.readouterr()

    assert main(["deploy", "render", "--spec", str(beta), "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "removed" not in said.err, said.err
    after = _files(out)
    assert {name: after[name] for name in alphas} == alphas, "another job's manifests or other files changed"
    assert sum(name.startswith(("configmap-beta", "statefulset-beta")) for name in after) == 4

    smaller = _deploy_spec(tmp_path, "alpha", sources=2)  # a source fewer: its two objects are stale
    assert main(["deploy", "render", "--spec", str(smaller), "--out", str(out)]) == 0
    said = capsys.readouterr()
    removed = sorted(re.findall(r"removed \S+/(\S+): an object of job alpha", said.err))
    assert removed == ["service-alpha-load-topics.yaml", "statefulset-alpha-load-topics.yaml"], said.err
    assert all((out / name).read_text() == text for name, text in theirs.items())
    assert (out / "statefulset-beta-load-topics.yaml").exists()

    # A file in the way that is not the job's own is refused before anything is written.
    in_the_way = out / "configmap-alpha-spec.yaml"
    in_the_way.write_text(
        "kind: ConfigMap\nmetadata: {labels: {app.kubernetes.io/name: mixflow, app.kubernetes.io/instance: gamma}}\n"
    )
    before = _files(out)
    assert main(["deploy", "render", "--spec", str(alpha), "--out", str(out)]) == REFUSED
    err = capsys.readouterr().err
    assert "configmap-alpha-spec.yaml is there and is an object of job gamma; not overwriting it" in err, err
    assert _files(out) == before


@pytest.mark.kafka
def test_a_second_run_of_a_job_running_on_this_machine_is_refused_before_it_touches_the_first_ones_files(
    world: dict[str, str], capsys: pytest.CaptureFixture
) -> None:
    from pipeline.spec import load_spec
    from pipeline.tools.run.exclusive import LOCK_FILE, RunLock
    from pipeline.tools.run.folders import job_folder

    state = Path(world["tmp"]) / "state-locked"
    job = load_spec(world["missing_job"]).job  # no roles in its groups: only the lock tells
    folder = job_folder(state, job)
    with RunLock(folder, job):
        (folder / "load-code-0.log").write_text("the first run's log\n")
        before = _files(folder)
        argv = [
            "run",
            "--spec",
            world["missing_job"],
            "--state-dir",
            str(state),
            "--bootstrap-servers",
            world["servers"],
        ]
        code = main(argv)
        err = capsys.readouterr().err
        assert code == REFUSED and f"job {job} is running on this machine: mixflow run (pid {os.getpid()} on " in err
        assert f"holds {folder / LOCK_FILE}" in err and len(err.strip().splitlines()) == 1, err
        assert _files(folder) == before
    with RunLock(folder, job):  # released by the first: the next run takes it
        pass


def test_run_keeps_each_jobs_files_under_its_own_name_where_top_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.cli import build_parser
    from pipeline.cli.run import run_folder
    from pipeline.tools.run.folders import job_folder
    from pipeline.tools.stack.local_broker import default_state_dir

    monkeypatch.setenv("MIXFLOW_STATE_DIR", str(tmp_path / "state"))
    parser = build_parser()
    folders = {
        job: run_folder(parser.parse_args(["run", "--spec", str(_deploy_spec(tmp_path, job))]), job)
        for job in ("alpha", "beta")
    }
    assert folders == {job: tmp_path / "state" / "jobs" / job for job in ("alpha", "beta")}
    assert all(folder == job_folder(default_state_dir(), job) for job, folder in folders.items())  # top's default
    renamed = parser.parse_args(["run", "--spec", "x.yaml", "--job", "gamma", "--state-dir", str(tmp_path / "s")])
    assert run_folder(renamed, "alpha") == tmp_path / "s" / "jobs" / "gamma"


# -- waits that say what for, and Ctrl-C ------------------------------------------------------------------


@pytest.mark.kafka
def test_a_loader_with_every_unit_done_says_so_and_ctrl_c_exits_130(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    from tests.loader_support import build_example_data

    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, build_example_data(tmp_path / "data", limit=2))
    log = tmp_path / "load.log"
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec), "--source", "docstrings"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 180
        while "every unit of docstrings is done; waiting for new ones" not in log.read_text(errors="replace"):
            assert process.poll() is None, f"the loader exited {process.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the loader never said it was idle:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)  # polls the loader's log for its notice, not a synchronisation delay
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == INTERRUPTED, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    said = log.read_text()
    assert "mixflow load: interrupted" in said and '"source": "docstrings"' in said and "Traceback" not in said, said


@pytest.fixture(scope="module")
def silent_store() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel completes them in the listen backlog) and never
    answers a byte: a store that hangs."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


SILENT_DEADLINE_S = 2.0


def _silent_spec(root: Path, endpoint: str) -> Path:
    import yaml

    storage = {
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "addressing_style": "path",
        "credentials": {
            "access_key_id": {"env": "MIXFLOW_TEST_S3_KEY"},
            "secret_access_key": {"env": "MIXFLOW_TEST_S3_KEY"},
        },
        "retry_deadline_s": SILENT_DEADLINE_S,
    }
    body = yaml.safe_load(write_spec(root, "silent", _dead_servers(), root / "no-data").read_text())
    body["sources"] = [{"name": "code", "reader": "jsonl", "path": "s3://corpus/code", "pretokenized": True}]
    body["mixture"] = {"weights": {"code": 1}}
    body["storage"] = storage
    (spec := root / "silent.yaml").write_text(yaml.safe_dump(body))
    return spec


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        ("spec check --files {spec}", USAGE),
        ("load --spec {spec} --source code", None),
        ("objects ls s3://corpus/code --endpoint-url {endpoint} --region us-east-1 --timeout-s 1", USAGE),
    ],
)
def test_a_store_that_never_answers_is_reported_within_the_deadline_saying_what_was_waited_for(
    argv: str,
    code: int | None,
    silent_store: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MIXFLOW_TEST_S3_KEY", "not-checked")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-checked")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-checked")
    args = argv.format(spec=_silent_spec(tmp_path, silent_store), endpoint=silent_store).split()
    began = time.monotonic()
    exit_code = main(args)
    took = time.monotonic() - began
    said = capsys.readouterr().err + caplog.text
    assert exit_code == code if code is not None else exit_code not in (0, None), said
    assert "Read timeout" in said and silent_store.removeprefix("http://") in said, said
    # Bounded by the spec's deadline (or two tries of --timeout-s): a few seconds, not botocore's minutes.
    assert took < 6 * SILENT_DEADLINE_S, f"{took:.0f} s: {said}"
    if "objects" not in argv:
        assert f"waiting for {silent_store} to answer (reading s3://corpus/code)" in said, said


def test_a_sigint_that_a_role_took_as_a_request_to_stop_still_counts_as_an_interruption() -> None:
    from pipeline.cli.boundary import watching_sigint

    previous = signal.getsignal(signal.SIGINT)
    stops: list[int] = []
    try:
        with watching_sigint() as interrupted:
            signal.signal(signal.SIGINT, lambda signum, _frame: stops.append(signum))  # as a role's handler does
            signal.raise_signal(signal.SIGINT)
        assert stops == [signal.SIGINT] and interrupted == [True]
        with watching_sigint() as quiet:
            pass
        assert quiet == [False]
    finally:
        signal.signal(signal.SIGINT, previous)


@given(st.one_of(st.integers(-(10**12), 10**12).map(str), st.floats(allow_nan=True).map(repr), st.text(max_size=6)))
def test_the_argument_types_take_exactly_the_values_in_their_range(text: str) -> None:
    import argparse

    from pipeline.cli.arguments import non_negative_float, non_negative_int, port, positive_float, positive_int

    def value(kind: type, least: float, above: bool) -> float | None:
        try:
            number = kind(text)
        except ValueError:
            return None
        finite = number == number and abs(number) != float("inf")
        return number if finite and (number > least if above else number >= least) else None

    expected = {
        positive_int: value(int, 0, True),
        non_negative_int: value(int, 0, False),
        positive_float: value(float, 0, True),
        non_negative_float: value(float, 0, False),
        port: v if (v := value(int, 0, False)) is not None and v <= 65535 else None,
    }
    for parse, wanted in expected.items():
        if wanted is None:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(text)
        else:
            assert parse(text) == wanted
