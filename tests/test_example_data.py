"""The example data builder: three sources and a tokenizer, with ids unique across the sources."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from pydoc_data.topics import topics as pydoc_topics
from types import ModuleType

import pyarrow.parquet as pq
import pytest

from connectors.planning import plan_units
from connectors.readers import Document, JsonlReader, ParquetReader, Reader, TextReader
from connectors.sample_ids import parse_sample_id
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "build_example_data.py"


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_example_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    return load_builder()


@pytest.fixture(scope="module")
def data(builder: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("example") / "data"
    assert builder.main(["--out", str(out), "--limit", "90", "--vocab-size", "400"]) == 0
    return out


def readers(data: Path) -> list[Reader]:
    return [
        ParquetReader("code", data / "code"),
        JsonlReader("docstrings", data / "docstrings"),
        TextReader("topics", data / "topics"),
    ]


def test_layout_of_the_sources(data: Path) -> None:
    code_files = sorted((data / "code").glob("*.parquet"))
    assert len(code_files) == 1  # 90 modules, 192 rows per file
    meta = pq.ParquetFile(code_files[0]).metadata
    assert meta.num_rows == 90
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [64, 26]
    paths = pq.read_table(code_files[0], columns=["path"]).column("path").to_pylist()
    assert paths == sorted(paths)
    assert not any(part in {"site-packages", "test", "tests"} for p in paths for part in p.split("/"))
    record = json.loads((data / "docstrings" / "part-00000.jsonl").read_text().splitlines()[0])
    assert set(record) == {"path", "qualname", "text"}
    topic_files = sorted(p.name for p in (data / "topics").glob("*.txt"))
    assert topic_files == sorted(f"{key}.txt" for key in pydoc_topics)[:90]


def test_every_sample_id_is_unique_across_sources(data: Path) -> None:
    tokenizer = TextTokenizer.from_file(data / "tokenizer.json")
    sample_builder = SampleBuilder(tokenizer, max_length=512, eod_id=tokenizer.token_id("<|endoftext|>"))
    ids: list[str] = []
    for reader in readers(data):
        for unit in plan_units(reader, cost_per_byte=1e-7, target_unit_cost=0.01):
            items = list(reader.read(unit))
            documents = [item for item in items if isinstance(item, Document)]
            assert len(documents) == len(items), f"dead letters in {unit.unit_id}"
            built = sample_builder.build(documents)
            assert built.dead_letters == []
            ids.extend(sample.sample_id for sample in built.samples)
    assert len(ids) == len(set(ids))
    assert {parse_sample_id(i).source for i in ids} == {"code", "docstrings", "topics"}


def test_second_build_skips_complete_outputs(builder: ModuleType, data: Path) -> None:
    again = builder.build(data, limit=90, vocab_size=400)
    assert again == dict.fromkeys(("code", "docstrings", "topics", "tokenizer.json"), False)
    (data / "topics" / "assert.txt").unlink()
    again = builder.build(data, limit=90, vocab_size=400)
    assert again == {"code": False, "docstrings": False, "topics": True, "tokenizer.json": False}
    assert (data / "topics" / "assert.txt").is_file()
