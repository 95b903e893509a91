"""Loading a job spec from YAML, with every problem reported at once, located and named."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.spec._locate import duplicate_keys, field_path, known_keys, line_of
from pipeline.spec._problems import NO_VALUE
from pipeline.spec.job import JobSpec
from topics.errors import MixflowError
from topics.formats.file_formats import glob_alternatives
from topics.kafka.settings import is_secret_key

_MAX_VALUE_CHARS = 80


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec: the field path, what is wrong, the value found, the file and line."""

    path: str
    message: str
    value: Any = NO_VALUE
    file: str = ""
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        got = "" if self.value is NO_VALUE else f" (got {_short(self.value)})"
        return f"{where}: {self.path}: {self.message}{got}" if where else f"{self.path}: {self.message}{got}"


class SpecError(MixflowError, ValueError):
    """A spec that cannot be loaded; ``problems`` lists all that were found, one per line in ``str``."""

    def __init__(self, file: str | Path, problems: list[SpecProblem]) -> None:
        self.file = str(file)
        self.problems = problems
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        lines = [f"invalid job spec {self.file} ({count}):", *(f"  {p}" for p in problems)]
        super().__init__("\n".join(lines))


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate the job spec at ``path``. Relative paths in it resolve against its folder.

    Raises ``SpecError`` with every problem found: YAML syntax (with its line), duplicate keys,
    and each invalid field (with its path, value and line). Checks needing more than one section
    (mixture names, tokenizer defaults, lengths against the step) run once every section is valid.
    """
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(file, [SpecProblem("(file)", f"cannot read: {exc}", file=file)]) from exc
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
        problem = SpecProblem("(yaml)", f"invalid YAML: {reason or exc}", file=file, line=line)
        raise SpecError(file, [problem]) from exc
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        problem = SpecProblem("(top level)", f"expected a mapping of spec sections, got {got}", file=file, line=1)
        raise SpecError(file, [problem])
    problems = [
        SpecProblem(field_path(loc), "key given twice (the last would silently win)", file=file, line=line)
        for loc, line in duplicate_keys(root)
    ]
    try:
        spec = JobSpec.model_validate(data, context={"base_dir": path.resolve().parent})
    except ValidationError as exc:
        problems += [_problem(error, file, root) for error in exc.errors()]
        raise SpecError(file, problems) from exc
    if problems:
        raise SpecError(file, problems)
    return spec


def _problem(error: Any, file: str, root: yaml.Node | None) -> SpecProblem:
    loc = tuple(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input", NO_VALUE)
    if any(isinstance(part, str) and is_secret_key(part) for part in loc):
        value = NO_VALUE  # a secret's value, however wrongly given, is never shown
    if error["type"] == "missing":
        message, value = "required", NO_VALUE
    elif error["type"] == "extra_forbidden":
        known = known_keys(JobSpec, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        message, value = f"unknown key ({hint})", loc[-1]
    return SpecProblem(field_path(loc), message, value, file, line_of(root, loc))


def check_files(spec: JobSpec, file: str | Path = "") -> list[SpecProblem]:
    """Problems with the files a spec names: source roots that are missing or match no file, and
    tokenizers that do not exist. Separate from ``load_spec`` so a spec can be checked before its data
    exists."""
    problems = []
    for i, source in enumerate(spec.sources):
        if isinstance(source.path, str):
            pass  # an object store's prefix: the loader lists it at start, and says what is wrong there
        elif not source.path.is_dir():
            problems.append(SpecProblem(f"sources[{i}].path", "no such folder", str(source.path), str(file)))
        elif source.glob and not any(next(source.path.glob(each), None) for each in glob_alternatives(source.glob)):
            problems.append(
                SpecProblem(f"sources[{i}].glob", f"matches no file under {source.path}", source.glob, str(file))
            )
        if source.tokenizer is not None and not source.tokenizer.is_file():
            problems.append(SpecProblem(f"sources[{i}].tokenizer", "no such file", str(source.tokenizer), str(file)))
    return problems


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema of a job spec, generated from the same models that validate it."""
    return JobSpec.model_json_schema()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."
