"""The multimodal example (``examples/multimodal.yaml``) at a test's size: its data rendered offline by the
example's own builder, and its spec pointed at that data, a job name and a broker."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import yaml

from tests.loader_support import REPO, example_body

EXAMPLES = REPO / "examples"


def multimodal_data_builder() -> ModuleType:
    """``examples/build_multimodal_data.py``, loaded as a module."""
    sys.path.insert(0, str(EXAMPLES))
    loaded = importlib.util.spec_from_file_location("build_multimodal_data", EXAMPLES / "build_multimodal_data.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def multimodal_spec(tmp_path: Path, data: Path, job: str, bootstrap: str, **composition: object) -> Path:
    """The example's spec over ``data`` at 512 tokens and 1,024 patches a micro-batch (with ``composition``'s
    settings where given), written to ``tmp_path``."""
    body = example_body("multimodal.yaml", data, job, bootstrap, "mm-tokenizer.json")
    body["step"]["tokens_per_micro_batch"] = 512
    body["step"]["patches_per_micro_batch"] = 1024
    if composition:
        body["composition"] = {**(body.get("composition") or {}), **composition}
    path = tmp_path / "multimodal.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path
