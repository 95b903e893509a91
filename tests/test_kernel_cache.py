"""The planning kernels' on-disk cache (``pipeline.planning.kernels.jit.kernel``) never runs old code: a kernel
that calls a jitted function of another module compiles again after that module changes, and loads from the
cache while nothing changed. Checked on a copy of ``pipeline/planning`` in a temporary folder, each run in a
fresh interpreter. Plain numba (``njit(cache=True)``) runs the old callee in the same situation, which is why
the planning kernels do not use it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLANNING = REPO / "pipeline" / "planning"

CALLEE = """
from {jit_module} import {decorator}

@{decorator}{options}
def answer():
    return {value}
"""

CALLER = """
from {jit_module} import {decorator}
from pipeline.planning.probe_callee import answer

@{decorator}{options}
def ask():
    return answer()
"""

RUN = "from pipeline.planning.probe_caller import ask; print(ask(), ask.stats.cache_hits and 'cached' or 'compiled')"


def _copy(tmp_path: Path) -> Path:
    """A copy of ``pipeline/planning`` (and an empty ``pipeline``) to import from."""
    root = tmp_path / "tree"
    shutil.copytree(PLANNING, root / "pipeline" / "planning", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "pipeline" / "__init__.py").write_text("")
    return root


def _write_probes(root: Path, value: int, *, plain_numba: bool) -> None:
    style = (
        {"jit_module": "numba", "decorator": "njit", "options": "(cache=True)"}
        if plain_numba
        else {"jit_module": "pipeline.planning.kernels.jit", "decorator": "kernel", "options": ""}
    )
    planning = root / "pipeline" / "planning"
    (planning / "probe_callee.py").write_text(CALLEE.format(value=value, **style))
    (planning / "probe_caller.py").write_text(CALLER.format(**style))


def _run(root: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT")}
    env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-c", RUN], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_caller_compiles_again_after_its_callee_in_another_module_changes(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write_probes(root, 1, plain_numba=False)
    assert _run(root) == "1 compiled"
    assert _run(root) == "1 cached", "nothing changed: the kernel comes from the cache"
    _write_probes(root, 2, plain_numba=False)
    assert _run(root) == "2 compiled", "the callee changed: the caller's cached code is not used"
    assert _run(root) == "2 cached"


def test_an_edit_anywhere_in_planning_compiles_the_kernels_again(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write_probes(root, 1, plain_numba=False)
    assert _run(root) == "1 compiled"
    other = root / "pipeline" / "planning" / "step" / "state.py"
    other.write_text(other.read_text() + "\n# an edit\n")
    assert _run(root) == "1 compiled"


def test_plain_numba_would_run_the_old_callee(tmp_path: Path) -> None:
    """What the kernel decorator is for: numba checks only the cached function's own file."""
    root = _copy(tmp_path)
    _write_probes(root, 1, plain_numba=True)
    assert _run(root) == "1 compiled"
    _write_probes(root, 2, plain_numba=True)
    assert _run(root) == "1 cached", "numba now notices a changed callee: kernels.jit may no longer be needed"


def test_every_planning_kernel_is_compiled_through_the_kernel_decorator() -> None:
    """Only ``kernels/jit.py`` imports numba, and only planning uses the decorator, whose digest covers
    ``pipeline/planning``: so every kernel and every module a kernel reads is in the digest."""
    users = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "pipeline").rglob("*.py")
        if "numba" in path.read_text() and ("import numba" in path.read_text() or "from numba" in path.read_text())
    }
    assert users == {"pipeline/planning/kernels/jit.py"}
    outside = [
        path.relative_to(REPO).as_posix()
        for package in ("pipeline", "topics", "connectors", "trainer_sink")
        for path in (REPO / package).rglob("*.py")
        if "kernels.jit" in path.read_text() and PLANNING not in path.parents
    ]
    assert outside == []


def test_the_warm_up_plans_every_kind_of_step() -> None:
    """``python -m pipeline.planning.warm`` (which scripts/test.sh runs first) plans text, composed, multimodal
    and context-parallel steps; in the repository's own cache, so a second run only loads."""
    warm = subprocess.run([sys.executable, "-m", "pipeline.planning.warm"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert warm.returncode == 0 and "planning kernels ready in" in warm.stdout, warm.stderr
