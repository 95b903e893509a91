"""Compressed sources through the real loader and broker: a source of gzip members and zstd frames publishes the
samples its plain twin does, id for id and token for token, while its loader splits units past their target
(``unit_target_s``); a broken file gives its rows before the break and one dead letter."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import yaml

from connectors.work_units import WorkUnit
from tests.compression_support import byte_tokenizer, compress, corrupt
from tests.loader_support import dead_letters, start_loader, wait_all
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end


def corpus(seed: int, rows: int) -> bytes:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "é", "字", "\\n", "x" * 40]
    return b"".join(
        json.dumps({"text": f"{seed}:{r} " + " ".join(rng.choice(words, int(rng.integers(1, 60))))}).encode() + b"\n"
        for r in range(rows)
    )


def write_sources(data: Path) -> dict[str, str]:
    """The same three files plain under ``plain/`` and compressed under ``packed/``; the packed name of each."""
    files = {"members.jsonl": corpus(1, 400), "frames.jsonl": corpus(2, 300), "broken.jsonl": corpus(3, 200)}
    names = {"members.jsonl": "members.jsonl.gz", "frames.jsonl": "frames.jsonl.zst", "broken.jsonl": "broken.jsonl.gz"}
    (data / "plain").mkdir(parents=True)
    (data / "packed").mkdir()
    for name, body in files.items():
        (data / "plain" / name).write_bytes(body)
    members = files["members.jsonl"]
    (data / "packed" / names["members.jsonl"]).write_bytes(
        b"".join(gzip.compress(members[i : i + 3_000], mtime=0) for i in range(0, len(members), 3_000))
    )
    frames = files["frames.jsonl"]
    (data / "packed" / names["frames.jsonl"]).write_bytes(
        compress(frames, "zstd-seekable", list(range(2_500, len(frames), 2_500)))
    )
    broken = files["broken.jsonl"]
    (data / "packed" / names["broken.jsonl"]).write_bytes(
        corrupt(compress(broken, "gzip-members", [len(broken) // 2]), "gzip-members", "bad-frame")
    )
    return names


def test_a_compressed_source_publishes_the_samples_of_its_plain_twin(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    names = write_sources(data)
    byte_tokenizer(save_to=data / "tokenizer.json")
    source = {"reader": "jsonl", "max_sample_length": 64, "eod_token_id": 0, "unit_target_s": 0.002}
    spec = {
        "job": unique_name,
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "tokenizer": str(data / "tokenizer.json"),
        "sources": [
            {"name": "plain", "path": str(data / "plain"), **source},
            {"name": "packed", "path": str(data / "packed"), **source},
        ],
        "mixture": {"weights": {"plain": 1, "packed": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 1024},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 7,
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    wait_all([start_loader(tmp_path / "spec.yaml", s, 0, tmp_path) for s in ("plain", "packed")], 240, tmp_path)

    topics = JobTopics(unique_name)
    samples = {}
    for name in ("plain", "packed"):
        records = read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.src(name), timeout_s=60)
        decoded = [decode_sample_message(record) for record in records]
        samples[name] = {_plain_id(s.sample_id, names): tuple(s.tokens.tolist()) for s in decoded}
        assert len(samples[name]) == len(decoded), f"{name}: an id delivered twice"
    broken_rows = {i for i in samples["plain"] if i.startswith("broken.jsonl/")}
    assert samples["packed"].keys() <= samples["plain"].keys()
    assert {i: t for i, t in samples["plain"].items() if i not in broken_rows} == {
        i: t for i, t in samples["packed"].items() if i not in broken_rows
    }
    assert all(samples["packed"][i] == samples["plain"][i] for i in samples["packed"].keys() & broken_rows)
    assert 0 < len(samples["packed"].keys() & broken_rows) < len(broken_rows)  # the first member's rows, not all
    units = [
        WorkUnit.from_json(r.value())
        for r in read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.work("packed"))
    ]
    for packed in ("members.jsonl.gz", "frames.jsonl.zst"):  # units of members and frames, through the work topic
        assert len([u for u in units if u.path == packed and u.byte_offset > 0]) > 2, units
    assert any(u.skip_bytes for u in units)
    letters = [d for d in dead_letters(kafka_bootstrap, topics) if d.source == "packed"]
    assert [d.location.split(":")[0] for d in letters] == ["broken.jsonl.gz"]
    assert letters[0].reason.startswith("cannot decompress: gzip member at byte ")


def _plain_id(sample_id: str, names: dict[str, str]) -> str:
    """``packed/members.jsonl.gz/3#1`` as ``members.jsonl/3#1``: the id within its source, by the plain name."""
    _, rest = sample_id.split("/", 1)
    for plain, packed in names.items():
        rest = rest.replace(f"{packed}/", f"{plain}/")
    return rest
