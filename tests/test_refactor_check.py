"""benchmarks/refactor_check.py on a small example job: the working tree against HEAD comes out identical.

In a clean checkout the working tree is HEAD, so this checks the check itself (worktree, imports per
tree, loader multisets, constructor byte comparison) and, on the way, that two runs of the loaders give
the same samples and two constructors over the same source topics write the same bytes. With
uncommitted changes that alter behaviour it fails, naming the first difference. It runs the two sides
at once (``--parallel``): most of its time is the two constructors compiling the numba scheduler."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "refactor_check.py"


def _has_git_history() -> bool:
    try:
        result = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=REPO, capture_output=True, check=False)
    except OSError:  # no git at all
        return False
    return result.returncode == 0


pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(not _has_git_history(), reason="the checkout has no git history to make a worktree from"),
]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("refactor_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_working_tree_is_identical_to_head(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    check = _load()
    args = check.parse_args(["--base", "HEAD", "--limit", "8", "--parallel", "--bootstrap-servers", kafka_bootstrap])
    result = check.run_check(args)
    check.report(result)
    out = capsys.readouterr().out
    assert result.identical, out
    assert [p.name for p in result.parts] == ["loaders", "constructor"]
    assert "VERDICT: IDENTICAL" in out
    # Something was compared: every source had samples, every rank topic messages, and both sides agree.
    assert sum(line.startswith("identical: rank ") for line in result.part("constructor").lines) == 2, out
    assert result.digests["base"] == result.digests["work"], result.digests
    assert " 0 rank-topic messages" not in result.digests["base"]
    samples = dict(re.findall(r"^identical: (\w+): (\d+) samples", "\n".join(result.part("loaders").lines), re.M))
    assert set(samples) == {"code", "docstrings", "topics"}, out
    assert all(int(n) > 0 for n in samples.values()), samples
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True)
    assert "refactor-check-" not in worktrees.stdout, "the worktree of HEAD was not removed"
