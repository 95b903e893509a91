"""Refactor check: does the working tree's code write what REV's code writes, on the example job?

    .venv/bin/python -m benchmarks.refactor_check [--base REV] [--spec SPEC] [--limit N]
        [--bootstrap-servers HOST:PORT] [--parallel] [--end-to-end] [--keep]

Both sides run as ``python -m pipeline.cli ...`` subprocesses with the current interpreter, cwd and
``PYTHONPATH`` set to their tree (``PYTHONPATH`` comes before the editable install's finder; each side
prints once where ``pipeline``, ``topics`` and ``connectors`` are imported from, and the check refuses
to go on when that is not its tree), and ``NUMBA_CACHE_DIR`` set to a fresh folder per side, so no
cached scheduler kernel of one tree (or a stale one of the same tree) is used.

1. **Loaders.** A git worktree of REV in a temporary folder runs the spec's loaders (every source,
   ``loaders:`` instances each, ``load --until-drained``) under job A; the working tree runs them under
   job B, over the same data. Which unit a loader commits first is not deterministic (nor, since units
   are sized by a timed measurement, how the files are cut into units), so per source the *multiset*
   of (sample id, token bytes, length, metadata) read back from ``<job>.src.<source>`` is compared,
   then the multiset of the encoded records (key, value, headers), and the dead-letter topics the
   same way.
2. **Constructor.** REV's and the working tree's constructor both read job A's source topics (a spec
   copy with ``job: A``), each writing under its own ``--output-job``. Every rank topic, the state
   topic and the dead-letter topic of the two outputs are compared message by message: key, value
   bytes and headers exactly, and the counts.
3. **Verdict.** One line per part: identical, or the first difference (topic, offset, what differs);
   the sha256 digest of each side's rank topics; the timings. Exit status 0 when identical, 1 on any
   difference, 2 when the check itself could not run (a role failed, git failed, ...).

Why not compare end to end: the order of a source topic depends on which loader commits which unit
first, and the constructor takes samples in source-topic order, so two runs of the same code over the
same data write the same samples in different steps (even a different number of steps). Only a
constructor over fixed source topics is byte for byte reproducible. ``--end-to-end`` shows it: it also
runs the working tree's constructor over job B's topics and reports, outside the verdict, whether its
rank topics equal REV's over job A.

The digest is sha256 over the rank topics in rank order, each topic's committed messages in order,
each message as its key, value and headers (count, then name and value each), every field prefixed
with its length as 8 little-endian bytes (all ones for a null).

Without ``--limit`` the data is examples/data (built, or brought up to date, with
examples/build_example_data.py); with ``--limit N`` a small data set of N modules is built in the
temporary folder and the spec's paths under examples/data point there instead.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from topics.errors import DecodeError
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent

DEFAULT_SPEC = REPO / "examples" / "example.yaml"
EXAMPLE_DATA = REPO / "examples" / "data"
BUILD_DATA = REPO / "examples" / "build_example_data.py"
PACKAGES = ("pipeline", "topics", "connectors")
READ_TIMEOUT_S = 300.0


class CheckError(Exception):
    """The check could not run to a verdict (as opposed to finding a difference)."""


@dataclass(frozen=True)
class Side:
    """One tree whose code runs the roles: REV's worktree ("base") or the working tree ("work")."""

    name: str
    label: str
    tree: Path
    cli_module: str
    numba_cache: Path

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.tree), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "NUMBA_CACHE_DIR": str(self.numba_cache)}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", self.cli_module, *args]


@dataclass
class Part:
    """The verdict on one part of the check."""

    name: str
    identical: bool = True
    first_difference: str = ""
    lines: list[str] = field(default_factory=list)
    informational: bool = False  # reported, but not part of the verdict

    def differs(self, what: str) -> None:
        if self.identical:
            self.identical, self.first_difference = False, what
        self.lines.append(f"DIFFERS: {what}")


@dataclass
class CheckResult:
    base_commit: str
    parts: list[Part] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return bool(self.parts) and all(p.identical for p in self.parts if not p.informational)

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)


# -- git and trees --------------------------------------------------------------------------------


def git(*args: str, cwd: Path = REPO) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        msg = f"git {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        raise CheckError(msg)
    return result.stdout.strip()


def add_worktree(rev: str, folder: Path) -> str:
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    git("worktree", "add", "--detach", str(folder), commit)
    return commit


def remove_worktree(folder: Path) -> None:
    try:
        git("worktree", "remove", "--force", str(folder))
    except CheckError as exc:
        print(f"warning: {exc}; removing the folder and pruning", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)


def verify_imports(side: Side) -> None:
    """Print where the side's interpreter imports the project's packages from; refuse another tree."""
    code = "import importlib, json; print(json.dumps({p: importlib.import_module(p).__file__ for p in %r}))"
    result = subprocess.run(
        [sys.executable, "-c", code % (PACKAGES,)],
        cwd=side.tree,
        env=side.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        msg = f"{side.label}: importing {', '.join(PACKAGES)} failed:\n{result.stderr[-2000:]}"
        raise CheckError(msg)
    files = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{side.name}: {side.label}: pipeline.__file__ = {files['pipeline']}")
    tree = side.tree.resolve()
    wrong = {p: f for p, f in files.items() if not Path(f).resolve().is_relative_to(tree)}
    if wrong:
        msg = f"{side.label}: packages imported from outside {tree}: {wrong}"
        raise CheckError(msg)


# -- data and spec --------------------------------------------------------------------------------


def prepare_data(limit: int | None, folder: Path) -> Path:
    """The example data folder: examples/data (built or brought up to date), or a small one of ``limit``
    modules built under ``folder``."""
    out = EXAMPLE_DATA if limit is None else folder / "data"
    command = [sys.executable, str(BUILD_DATA), "--out", str(out)]
    if limit is not None:
        command += ["--limit", str(limit)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        msg = f"building the example data failed:\n{(result.stdout + result.stderr)[-3000:]}"
        raise CheckError(msg)
    return out


def _resolve(value: str, base: Path, data: Path) -> str:
    """``value`` made absolute against the spec's folder, moved from examples/data to ``data``."""
    path = Path(value).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    example = EXAMPLE_DATA.resolve()  # examples/data may be a link to another checkout's
    if data != EXAMPLE_DATA and path.is_relative_to(example):
        path = data / path.relative_to(example)
    return str(path)


def spec_copy(spec: dict[str, Any], spec_path: Path, job: str, data: Path, bootstrap: str, out: Path) -> Path:
    """The spec renamed to ``job``, with absolute paths (under ``data``) and ``bootstrap``, written to ``out``."""
    body = copy.deepcopy(spec)
    base = spec_path.resolve().parent
    body["job"] = job
    body.setdefault("kafka", {})["bootstrap_servers"] = bootstrap
    if body.get("tokenizer"):
        body["tokenizer"] = _resolve(body["tokenizer"], base, data)
    for source in body.get("sources", []):
        for key in ("path", "tokenizer"):
            if source.get(key):
                source[key] = _resolve(source[key], base, data)
    out.write_text(yaml.safe_dump(body, sort_keys=False))
    return out


# -- running roles --------------------------------------------------------------------------------


@dataclass
class Role:
    side: Side
    name: str
    process: subprocess.Popen
    log: Path
    ended: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON line a role prints last."""
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        return {}

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def run_roles(roles: Sequence[tuple[Side, str, list[str]]], logs: Path, timeout_s: float) -> dict[str, list[Role]]:
    """Start every role (side, name, cli arguments) at once and wait for all; a failure stops the rest.
    Returns the roles per side, each with the moment it ended."""
    started: list[Role] = []
    try:
        for side, name, args in roles:
            log = logs / f"{side.name}-{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    side.command(*args), cwd=side.tree, env=side.env(), stdout=out, stderr=subprocess.STDOUT
                )
            started.append(Role(side, name, process, log))
        deadline = time.monotonic() + timeout_s
        running = list(started)
        while running:
            for role in list(running):
                code = role.process.poll()
                if code is None:
                    continue
                role.ended = time.monotonic()
                running.remove(role)
                if code != 0:
                    msg = f"{role.side.name} {role.name} exited with {code}; its log ends:\n{role.tail()}"
                    raise CheckError(msg)
            if running and time.monotonic() > deadline:
                role = running[0]
                msg = f"{role.side.name} {role.name} did not finish in {timeout_s:.0f} s; its log ends:\n{role.tail()}"
                raise CheckError(msg)
            time.sleep(0.05)  # supervising child processes: nothing to wait on but their exit
    finally:
        for role in started:
            if role.process.poll() is None:
                role.process.kill()
                role.process.wait(timeout=30)
    by_side: dict[str, list[Role]] = {}
    for role in started:
        by_side.setdefault(role.side.name, []).append(role)
    return by_side


def loader_roles(spec: dict[str, Any], spec_file: Path, bootstrap: str) -> list[tuple[str, list[str]]]:
    roles = []
    for source in spec["sources"]:
        for instance in range(int(source.get("loaders", 1))):
            args = [
                "load",
                "--spec",
                str(spec_file),
                "--source",
                source["name"],
                "--instance",
                str(instance),
                "--until-drained",
                "--bootstrap-servers",
                bootstrap,
            ]
            roles.append((f"load-{source['name']}-{instance}", args))
    return roles


# -- reading and comparing topics -----------------------------------------------------------------


def _headers(message: Message) -> tuple[tuple[str, bytes | None], ...]:
    return tuple(message.headers() or ())


def _raw(message: Message) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]:
    return message.key(), message.value(), _headers(message)


def _read(config: dict[str, Any], topic: str) -> list[Message]:
    return read_to_end(config, topic, timeout_s=READ_TIMEOUT_S)


def _short(data: object, limit: int = 160) -> str:
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _sample_tuple(message: Message) -> tuple:
    """(sample id, token bytes, length, metadata) of a source record; an undecodable one as its raw value."""
    try:
        sample = decode_sample_message(message)
    except DecodeError as exc:
        return ("<undecodable>", message.value(), -1, (("error", exc.reason),))
    tokens = sample.tokens.astype("<i4", copy=False).tobytes()
    return sample.sample_id, tokens, sample.length, tuple(sorted(sample.metadata.items()))


def _describe_sample_difference(only_a: Counter, only_b: Counter, job_a: str, job_b: str) -> str:
    by_id_a = {t[0]: t for t in only_a}
    by_id_b = {t[0]: t for t in only_b}
    first = min(set(by_id_a) | set(by_id_b))
    if first in by_id_a and first in by_id_b:
        a, b = by_id_a[first], by_id_b[first]
        fields = [name for name, x, y in zip(("id", "tokens", "length", "metadata"), a, b, strict=True) if x != y]
        detail = "; ".join(
            f"{n}: {_short(x, 80)} vs {_short(y, 80)}"
            for n, x, y in zip(("id", "tokens", "length", "metadata"), a, b, strict=True)
            if n in fields
        )
        return f"sample {first} differs in {', '.join(fields)} ({detail})"
    where, more = (job_a, only_a[by_id_a[first]]) if first in by_id_a else (job_b, only_b[by_id_b[first]])
    return f"{where} holds sample {first} {more} time(s) more than the other topic"


def compare_sources(config: dict[str, Any], sources: Sequence[str], job_a: str, job_b: str, part: Part) -> None:
    """Per source, the multiset of decoded samples and of encoded records of job A against job B."""
    for source in sources:
        topic_a, topic_b = f"{job_a}.src.{source}", f"{job_b}.src.{source}"
        records_a, records_b = _read(config, topic_a), _read(config, topic_b)
        samples_a = Counter(_sample_tuple(m) for m in records_a)
        samples_b = Counter(_sample_tuple(m) for m in records_b)
        counts = f"{len(records_a)} vs {len(records_b)} records"
        repeated = {job: sum(n - 1 for n in c.values() if n > 1) for job, c in ((job_a, samples_a), (job_b, samples_b))}
        if any(repeated.values()):
            part.lines.append(f"note: {source}: samples repeated within one job: {repeated}")
        if samples_a != samples_b:
            only_a, only_b = samples_a - samples_b, samples_b - samples_a
            what = _describe_sample_difference(only_a, only_b, topic_a, topic_b)
            part.differs(
                f"{source}: {what} ({counts}; {sum(only_a.values())} only in {topic_a}, "
                f"{sum(only_b.values())} only in {topic_b})"
            )
            continue
        raw_a, raw_b = Counter(_raw(m) for m in records_a), Counter(_raw(m) for m in records_b)
        if raw_a != raw_b:
            key = min((raw_a - raw_b) or (raw_b - raw_a), key=lambda r: r[0] or b"")
            part.differs(
                f"{source}: the same samples are encoded differently, e.g. record key {key[0]!r} "
                f"(headers {key[2]!r}) ({counts})"
            )
            continue
        tokens = sum(t[2] for t in samples_a.elements())
        same_order = [_raw(m) for m in records_a] == [_raw(m) for m in records_b]
        order = "same order" if same_order else "in another order (expected: loaders commit units in no fixed order)"
        part.lines.append(f"identical: {source}: {len(records_a)} samples, {tokens} tokens; {order}")
    compare_dead_letters(config, job_a, job_b, part)


def compare_dead_letters(config: dict[str, Any], job_a: str, job_b: str, part: Part) -> None:
    topic_a, topic_b = f"{job_a}.dlq", f"{job_b}.dlq"
    raw_a = Counter(_raw(m) for m in _read(config, topic_a))
    raw_b = Counter(_raw(m) for m in _read(config, topic_b))
    if raw_a != raw_b:
        only_a, only_b = raw_a - raw_b, raw_b - raw_a
        where, left = (topic_a, only_a) if only_a else (topic_b, only_b)
        record = min(left, key=lambda r: (r[0] or b"", r[1] or b""))
        part.differs(
            f"dead letters: {_short(record[1], 300)} is only in {where} "
            f"({sum(raw_a.values())} vs {sum(raw_b.values())} dead letters)"
        )
        return
    part.lines.append(f"identical: dead letters: {sum(raw_a.values())}")


def work_units(config: dict[str, Any], job: str) -> dict[str, int]:
    """Units per source in the job's work plans (control records ``work-plan/<source>``)."""
    units = {}
    for message in _read(config, f"{job}.control"):
        if (message.key() or b"").startswith(b"work-plan/"):
            try:
                plan = json.loads(message.value())
                units[str(plan["source"])] = int(plan["units"])
            except (ValueError, KeyError, TypeError):
                continue
    return units


def _describe_batch_difference(a: bytes | None, b: bytes | None) -> str:
    """What differs between two rank-topic values: decoded with pyarrow when both are Arrow streams."""
    import pyarrow as pa

    if not a or not b:
        return f"value of {len(a or b'')} bytes vs {len(b or b'')} bytes"
    try:
        table_a, table_b = pa.ipc.open_stream(a).read_all(), pa.ipc.open_stream(b).read_all()
    except pa.ArrowInvalid:
        return _describe_bytes_difference(a, b)
    if table_a.schema != table_b.schema:
        return f"Arrow schema differs: {_short(str(table_a.schema), 300)} vs {_short(str(table_b.schema), 300)}"
    if table_a.num_rows != table_b.num_rows:
        return f"{table_a.num_rows} vs {table_b.num_rows} samples"
    ids = table_a.column("sample_id").to_pylist() if "sample_id" in table_a.column_names else None
    for name in table_a.column_names:
        column_a, column_b = table_a.column(name).to_pylist(), table_b.column(name).to_pylist()
        for row, (x, y) in enumerate(zip(column_a, column_b, strict=True)):
            if x == y:
                continue
            where = f"column {name} row {row}" + (f" (sample {ids[row]})" if ids else "")
            if isinstance(x, list) and isinstance(y, list):
                i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
                item_a, item_b = (v[i] if i < len(v) else "<end>" for v in (x, y))
                return f"{where}: item {i} of {len(x)} vs {len(y)}: {item_a!r} vs {item_b!r}"
            return f"{where}: {_short(x, 120)} vs {_short(y, 120)}"
    return f"the same table, other bytes: {_describe_bytes_difference(a, b)}"


def _describe_headers_difference(a: Sequence[tuple[str, Any]], b: Sequence[tuple[str, Any]]) -> str:
    if [name for name, _ in a] != [name for name, _ in b]:
        return f"header names {[n for n, _ in a]} vs {[n for n, _ in b]}"
    return "headers differ: " + ", ".join(f"{n} {x!r} vs {y!r}" for (n, x), (_, y) in zip(a, b, strict=True) if x != y)


def _describe_bytes_difference(a: bytes, b: bytes) -> str:
    """Where two values part, with a few bytes around it."""
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, at - 24)
    return (
        f"value bytes differ from byte {at} ({len(a)} vs {len(b)} bytes): "
        f"...{a[lo : at + 40]!r}... vs ...{b[lo : at + 40]!r}..."
    )


def compare_exactly(config: dict[str, Any], topic_a: str, topic_b: str, part: Part, kind: str) -> list[Message]:
    """Message by message: key, value and headers; returns topic A's messages."""
    records_a, records_b = _read(config, topic_a), _read(config, topic_b)
    for index, (x, y) in enumerate(zip(records_a, records_b, strict=False)):
        if _raw(x) == _raw(y):
            continue
        where = f"{topic_a}@{x.offset()} vs {topic_b}@{y.offset()} (message #{index})"
        if x.key() != y.key():
            what = f"key {x.key()!r} vs {y.key()!r}"
        elif _headers(x) != _headers(y):
            what = f"key {x.key()!r}: {_describe_headers_difference(_headers(x), _headers(y))}"
        elif kind == "rank":
            what = f"key {x.key()!r}: {_describe_batch_difference(x.value(), y.value())}"
        else:
            what = f"key {x.key()!r}: {_describe_bytes_difference(x.value() or b'', y.value() or b'')}"
        part.differs(f"{where}: {what}")
        return records_a
    if len(records_a) != len(records_b):
        extra = records_a[len(records_b)] if len(records_a) > len(records_b) else records_b[len(records_a)]
        part.differs(
            f"{topic_a} holds {len(records_a)} messages, {topic_b} {len(records_b)}; the first extra one "
            f"is at {extra.topic()}@{extra.offset()}, key {extra.key()!r}"
        )
        return records_a
    part.lines.append(f"identical: {kind} {topic_a} = {topic_b}: {len(records_a)} messages")
    return records_a


def _frame(digest: Any, data: bytes | str | None) -> None:
    if data is None:
        digest.update(b"\xff" * 8)
        return
    raw = data.encode() if isinstance(data, str) else data
    digest.update(len(raw).to_bytes(8, "little"))
    digest.update(raw)


def rank_digest(config: dict[str, Any], job: str, ranks: int) -> tuple[str, int]:
    """sha256 over every rank topic's messages in order (see the module docstring), and their count."""
    digest = hashlib.sha256()
    count = 0
    for rank in range(ranks):
        for message in _read(config, f"{job}.rank.{rank}"):
            key, value, headers = _raw(message)
            _frame(digest, key)
            _frame(digest, value)
            digest.update(len(headers).to_bytes(8, "little"))
            for name, header in headers:
                _frame(digest, name)
                _frame(digest, header)
            count += 1
    return digest.hexdigest(), count


def delete_jobs(config: dict[str, Any], jobs: Iterable[str], groups: Iterable[str]) -> None:
    """Delete the topics of ``jobs`` (names starting ``<job>.``) and the consumer ``groups``; best effort."""
    admin = AdminClient(config)
    prefixes = tuple(f"{job}." for job in jobs)
    try:
        names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefixes)]
        for future in admin.delete_topics(names, operation_timeout=60).values() if names else ():
            future.result(timeout=90)
        for future in admin.delete_consumer_groups(list(groups), request_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception:  # a group that never committed does not exist
                continue
    except Exception as exc:
        print(f"warning: deleting the check's topics failed: {exc}", file=sys.stderr)


# -- the check ------------------------------------------------------------------------------------


def run_phase(
    result: CheckResult, phase: str, roles: Sequence[tuple[Side, str, list[str]]], args: argparse.Namespace, logs: Path
) -> dict[str, list[Role]]:
    """Run ``roles`` side after side (or, with ``--parallel``, all at once); time each side's roles from
    their start until the last one ended."""
    sides = list(dict.fromkeys(side for side, _, _ in roles))
    groups = [list(roles)] if args.parallel else [[r for r in roles if r[0] is side] for side in sides]
    by_side: dict[str, list[Role]] = {}
    for group in groups:
        names = " and ".join(dict.fromkeys(side.name for side, _, _ in group))
        print(f"{phase}: {names} ({len(group)} processes) ...", flush=True)
        began = time.monotonic()
        done = run_roles(group, logs, args.timeout)
        for name, ran in done.items():
            result.timings[f"{name} {phase}"] = max(r.ended for r in ran) - began
        by_side.update(done)
    return by_side


def run_check(args: argparse.Namespace) -> CheckResult:
    spec_path = Path(args.spec).resolve()
    spec = yaml.safe_load(spec_path.read_text())
    sources = [s["name"] for s in spec["sources"]]
    ranks = int(spec["step"]["ranks"])
    bootstrap = args.bootstrap_servers
    config = {**(spec.get("kafka") or {}).get("config", {}), "bootstrap.servers": bootstrap}
    tag = f"rc{uuid.uuid4().hex[:8]}"
    job_a, job_b, out_a, out_b, out_bb = f"{tag}-a", f"{tag}-b", f"{tag}-ca", f"{tag}-cb", f"{tag}-cbb"
    folder = Path(tempfile.mkdtemp(prefix="refactor-check-"))
    logs = folder / "logs"
    logs.mkdir()
    worktree = folder / "base"
    result = CheckResult(base_commit="")
    began = time.monotonic()
    try:
        result.base_commit = add_worktree(args.base, worktree)
        base = Side(
            "base",
            f"REV {args.base} ({result.base_commit[:12]})",
            worktree,
            args.base_cli_module,
            folder / "numba-base",
        )
        work = Side("work", f"working tree {REPO}", REPO, args.cli_module, folder / "numba-work")
        for side in (base, work):
            verify_imports(side)

        t = time.monotonic()
        data = prepare_data(args.limit, folder)
        result.timings["data"] = time.monotonic() - t
        spec_a = spec_copy(spec, spec_path, job_a, data, bootstrap, folder / "spec-a.yaml")
        spec_b = spec_copy(spec, spec_path, job_b, data, bootstrap, folder / "spec-b.yaml")
        print(
            f"jobs: loaders {job_a} (base) and {job_b} (work); constructors {out_a} (base) and {out_b} (work), "
            f"both over {job_a}'s sources; data {data}; logs {logs}",
            flush=True,
        )

        loader_runs = run_phase(
            result,
            "loaders",
            [(base, *role) for role in loader_roles(spec, spec_a, bootstrap)]
            + [(work, *role) for role in loader_roles(spec, spec_b, bootstrap)],
            args,
            logs,
        )
        constructor_runs = run_phase(
            result,
            "constructor",
            [
                (
                    side,
                    "construct",
                    ["construct", "--spec", str(spec_a), "--output-job", out, "--bootstrap-servers", bootstrap],
                )
                for side, out in ((base, out_a), (work, out_b))
            ],
            args,
            logs,
        )
        constructors = {f"{name} constructor over {job_a}": roles[0] for name, roles in constructor_runs.items()}
        if args.end_to_end:
            own = run_phase(
                result,
                "constructor over job B",
                [
                    (
                        work,
                        "construct-own",
                        ["construct", "--spec", str(spec_b), "--output-job", out_bb, "--bootstrap-servers", bootstrap],
                    )
                ],
                args,
                logs,
            )
            constructors[f"work constructor over {job_b}"] = own["work"][0]
        for name, role in constructors.items():
            summary = role.summary()
            result.notes.append(
                f"{name}: {summary.get('steps')} steps, {summary.get('samples')} samples, "
                f"{summary.get('tokens')} tokens, {summary.get('seconds')} s inside"
            )

        t = time.monotonic()
        loaders = Part("loaders")
        compare_sources(config, sources, job_a, job_b, loaders)
        units_a, units_b = work_units(config, job_a), work_units(config, job_b)
        loaders.lines.append(
            f"note: work units planned per source: {job_a} {units_a}, {job_b} {units_b}"
            + ("" if units_a == units_b else " (units are sized by a timed measurement)")
        )
        for name, roles in loader_runs.items():
            summaries = [r.summary() for r in roles]
            busy = ", ".join(
                f"{s.get('source')}/{s.get('instance')}: {s.get('units')} units "
                f"{s.get('samples')} samples {s.get('seconds')} s"
                for s in summaries
            )
            loaders.lines.append(f"note: {name} loaders: {busy}")
        constructor = Part("constructor")
        for rank in range(ranks):
            compare_exactly(config, f"{out_a}.rank.{rank}", f"{out_b}.rank.{rank}", constructor, "rank")
        compare_exactly(config, f"{out_a}.state", f"{out_b}.state", constructor, "state")
        compare_exactly(config, f"{out_a}.dlq", f"{out_b}.dlq", constructor, "dlq")
        result.parts += [loaders, constructor]
        if args.end_to_end:
            own = Part("end-to-end", informational=True)
            for rank in range(ranks):
                compare_exactly(config, f"{out_a}.rank.{rank}", f"{out_bb}.rank.{rank}", own, "rank")
            result.parts.append(own)
        digested = [("base", out_a), ("work", out_b)] + ([("work over job B", out_bb)] if args.end_to_end else [])
        for name, out in digested:
            digest, count = rank_digest(config, out, ranks)
            result.digests[name] = f"sha256:{digest} ({count} rank-topic messages)"
        result.timings["compare"] = time.monotonic() - t
    finally:
        result.timings["total"] = time.monotonic() - began
        if worktree.exists() or result.base_commit:
            remove_worktree(worktree)
        if args.keep:
            print(f"kept {folder} and the topics of {tag}-*")
        else:
            groups = [f"{job}.loaders.{s}" for job in (job_a, job_b) for s in sources]
            outs = (out_a, out_b, out_bb)
            delete_jobs(config, (job_a, job_b, *outs), [*groups, *(f"{out}.constructor" for out in outs)])
            shutil.rmtree(folder, ignore_errors=True)
    return result


def report(result: CheckResult) -> None:
    print()
    for part in result.parts:
        for line in part.lines:
            print(f"  {part.name}: {line}")
    for note in result.notes:
        print(f"  note: {note}")
    for name, digest in result.digests.items():
        print(f"digest {name}: {digest}")
    print("timings: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result.timings.items()))
    for part in result.parts:
        verdict = "IDENTICAL" if part.identical else f"DIFFERENT: first difference: {part.first_difference}"
        print(f"{'INFO' if part.informational else 'VERDICT'} {part.name}: {verdict}")
    print(f"VERDICT: {'IDENTICAL' if result.identical else 'DIFFERENT'} (working tree vs {result.base_commit[:12]})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the revision to check against (default: %(default)s)")
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="the job spec (default: examples/example.yaml)")
    parser.add_argument(
        "--limit",
        type=int,
        help="build a small example data set of this many modules (default: the full examples/data, built if missing)",
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="the broker (default: $KAFKA_BOOTSTRAP_SERVERS or %(default)s)",
    )
    parser.add_argument("--cli-module", default="pipeline.cli", help="the working tree's CLI (default: %(default)s)")
    parser.add_argument("--base-cli-module", default="pipeline.cli", help="REV's CLI module (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per phase (default: %(default)s)")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run the two sides' loaders (and then constructors) at the same time: quicker, but each side's "
        "timing then includes the other's load",
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="also run the working tree's constructor over its own loaders' topics (job B) and report, outside "
        "the verdict, whether its rank topics equal REV's over job A (they need not: loader order is not fixed)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, specs) and the topics")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run_check(args)
    except CheckError as exc:
        print(f"refactor check could not run: {exc}", file=sys.stderr)
        return 2
    except Exception:  # a broker or client failure is no verdict either
        print(f"refactor check could not run:\n{traceback.format_exc()}", file=sys.stderr)
        return 2
    report(result)
    return 0 if result.identical else 1


if __name__ == "__main__":
    sys.exit(main())
