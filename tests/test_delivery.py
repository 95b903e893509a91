"""The report's end-to-end delivery checks, on batches and received logs made here (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.tools.delivery import RECEIVED_FILE, check_trainer, tokens_sha256, trained_sequence
from tests.sink_support import random_batch
from topics.formats.packing import pack_micro_batches


def _lines(steps: list, rank: int) -> list[dict]:
    return [
        {"step": b.step, "micro_batch": m, "sample_ids": p.sample_ids, "tokens_sha256": tokens_sha256(p.token_ids)}
        for b in (step[rank] for step in steps)
        for m, p in enumerate(pack_micro_batches(b))
    ]


def _write(folder: Path, rank: int, lines: list[dict]) -> None:
    (folder / RECEIVED_FILE.format(rank=rank)).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_resume_replaces_what_followed_the_checkpoint() -> None:
    keys = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (1, 0), (1, 1), (2, 0), (2, 1), (0, 0), (0, 1)]
    assert trained_sequence([(*k, "x") for k in keys]) == [(0, 0, "x"), (0, 1, "x")]
    assert [k[:2] for k in trained_sequence([(*k, "x") for k in keys[:9]])] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]


def test_trainer_check_compares_ids_and_token_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    steps = [[random_batch(rng, s, r, 2, 2, 64) for r in range(2)] for s in range(5)]
    rank0, rank1 = _lines(steps, 0), _lines(steps, 1)
    _write(tmp_path, 0, rank0[:6] + rank0[4:])  # killed after step 2, resumed from the checkpoint at step 2
    _write(tmp_path, 1, rank1)
    check = check_trainer(tmp_path, steps)
    assert check.problems == [] and check.received == check.micro_batches == 20
    tampered = [dict(line) for line in rank1]
    tampered[7]["tokens_sha256"] = tokens_sha256(np.array([1, 2, 3], np.int32))
    _write(tmp_path, 1, tampered)
    assert check_trainer(tmp_path, steps).problems == [
        "rank 1: 10 micro-batches received, 10 written, first difference at micro-batch 7"
    ]
    _write(tmp_path, 1, rank1[:-1])  # the trainer stopped one micro-batch short
    assert "9 micro-batches received, 10 written" in check_trainer(tmp_path, steps).problems[0]
