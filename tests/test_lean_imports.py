"""Each `mixflow` command loads only what it runs: its help loads no implementation, and a loader process
loads no scheduler, numba, autoscaler, plotting or trainer library. Each case runs in a fresh interpreter,
since this one has imported everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Runs `mixflow ARGS...` in-process, its output discarded, then prints the modules it loaded.
_CHILD = """
import contextlib, io, json, sys
from pipeline.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""

# What no role process needs; a module here is also refused with its submodules.
NEVER_IN_A_LOADER = (
    "numba",
    "llvmlite",
    "matplotlib",
    "rich",
    "torch",
    "tokenizers",  # a pre-tokenized source needs none; a text source loads it with its tokenizer
    "pipeline.planning.scheduler",
    "pipeline.planning.mixing.mixer",
    "pipeline.roles.constructor",
    "pipeline.roles.autoscale",
    "pipeline.tools",
    "trainer_sink",
)
# A command's help needs argparse and the command's own module, not what the command runs.
NEVER_IN_A_HELP = (
    *NEVER_IN_A_LOADER,
    "confluent_kafka",
    "pyarrow",
    "numpy",
    "pydantic",
    "fastavro",
    "prometheus_client",
    "connectors",
    "pipeline.roles.loader.role",
    "pipeline.spec",
)


def _loaded(*args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, f"mixflow {' '.join(args)} in a child interpreter failed:\n{done.stderr}"
    return json.loads(done.stdout)


def _offending(modules: list[str], refused: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == r or m.startswith(r + ".") for r in refused)]


@pytest.mark.parametrize(
    "args",
    [("--help",), ("load", "--help"), ("top", "--help"), ("autoscale", "--help"), ("replay", "--help")],
    ids=lambda args: " ".join(args),
)
def test_a_help_loads_no_implementation(args: tuple[str, ...]) -> None:
    offending = _offending(_loaded(*args), NEVER_IN_A_HELP)
    assert not offending, f"`mixflow {' '.join(args)}` loaded {offending}"


def test_the_constructors_help_loads_no_constructor() -> None:
    # Its lease timeout's default lives beside the lease, with a Kafka client: that much it loads.
    offending = _offending(_loaded("construct", "--help"), ("numba", "pipeline.roles.constructor.role", "pyarrow"))
    assert not offending, f"`mixflow construct --help` loaded {offending}"


def test_a_loader_loads_only_what_loading_needs(tmp_path: Path) -> None:
    # Every module of `mixflow load` is imported before it reads the spec, which here is missing.
    modules = _loaded("load", "--spec", str(tmp_path / "missing.yaml"), "--source", "web")
    assert "pipeline.roles.loader.role" in modules, "the loader's module was not imported: the case tests nothing"
    offending = _offending(modules, NEVER_IN_A_LOADER)
    assert not offending, f"`mixflow load` loaded {offending}"
    # Only the reader of the source's format loads its part of pyarrow.
    assert not _offending(modules, ("pyarrow.parquet", "pyarrow.compute"))
