"""What each install declares: every package that ``trainer_sink`` (and ``topics``, which it imports) imports is
a core dependency or in the ``trainer`` extra, and each integration's framework is in that integration's
extra, which also pulls in the trainer side; the core install pulls in no training framework, and nothing that only
the tests import."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OWN = {"pipeline", "topics", "connectors", "trainer_sink", "tests"}
# The name a package is imported by, where it is not its distribution's.
DISTRIBUTION = {
    "yaml": "pyyaml",
    "PIL": "pillow",
    "lazy_loader": "lazy-loader",
    "confluent_kafka": "confluent-kafka",
    "prometheus_client": "prometheus-client",
    "pydantic_core": "pydantic",
    "megatron": "megatron-core",
}
INTEGRATIONS = {
    "hf_trainer": "huggingface",
    "lightning_data": "lightning",
    "torchtitan_data": "torchtitan",
    "torchtitan_cp": "torchtitan",
    "torchtitan_cp_trainer": "torchtitan",
    "megatron_data": "megatron",
    "megatron_batch": "megatron",
}
FRAMEWORKS = {"transformers", "accelerate", "lightning", "torchtitan", "megatron-core", "torch"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def _imported(paths: list[Path]) -> set[str]:
    """The distributions the modules import (anywhere in them, lazily too), the standard library left out."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in OWN and top not in sys.stdlib_module_names:
                    found.add(DISTRIBUTION.get(top, top).lower())
    return found


def _extra(name: str) -> set[str]:
    extras = PROJECT["optional-dependencies"]
    declared = _names(extras[name])
    if "mixflow" in declared:
        declared = (declared - {"mixflow"}) | _extra("trainer")
    return declared


def test_the_trainer_side_declares_what_it_imports() -> None:
    sink = [p for p in (REPO / "trainer_sink").rglob("*.py") if "integrations" not in p.parts]
    imported = _imported(sink + list((REPO / "topics").rglob("*.py")))
    assert "torch" in imported
    undeclared = imported - _names(PROJECT["dependencies"]) - _extra("trainer")
    assert undeclared == set(), f"trainer_sink imports packages that no install of it declares: {undeclared}"


def test_each_integration_declares_its_framework_and_the_core_install_none() -> None:
    core = _names(PROJECT["dependencies"])
    assert core & FRAMEWORKS == set()
    for module, extra in INTEGRATIONS.items():
        imported = _imported([REPO / "trainer_sink" / "integrations" / f"{module}.py"])
        undeclared = imported - core - _extra(extra)
        assert undeclared == set(), f"mixflow[{extra}] lacks what {module} imports: {undeclared}"
        assert "torch" in _extra(extra), f"mixflow[{extra}] does not pull in the trainer side"


def test_every_core_dependency_is_imported_by_the_production_code() -> None:
    """A package only tests, benchmarks or examples import belongs in an extra, not in every install."""
    production = [p for package in sorted(OWN - {"tests"}) for p in (REPO / package).rglob("*.py")]
    unused = _names(PROJECT["dependencies"]) - _imported(production)
    assert unused == set(), f"core dependencies that no production module imports: {unused}"
