"""The sink hands out the message's token ids without a copy and without torch's warning that they are not
writable. torch warns once per process, so the sink is iterated in a fresh interpreter that shows every
warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sink_support import random_batch, write_steps
from topics.formats.batch_codec import decode_batch, encode_batch
from trainer_sink import Layout, micro_batch_tensors

REPO = Path(__file__).resolve().parent.parent

_ITERATE_THE_SINK = """
import json, sys, warnings
from trainer_sink import KafkaBatchDataset, ReadOptions
# A trainer's own filters, added after the import: they come first in the process's list.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    read = ReadOptions(wait_timeout_s=60)
    dataset = KafkaBatchDataset(job=sys.argv[1], bootstrap_servers=sys.argv[2], rank=0, read=read)
    micro_batches = sum(1 for _ in dataset)
print(json.dumps({"micro_batches": micro_batches, "warnings": [str(w.message) for w in caught]}))
"""


@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(list(Layout)))
def test_token_ids_are_a_view_of_the_message(seed: int, layout: Layout) -> None:
    batch = random_batch(np.random.default_rng(seed), 0, 0, 1, 3, 256)
    _, value, headers = encode_batch(batch)
    decoded = decode_batch(value, headers)
    assert not decoded.tokens.flags.writeable, "the decoded ids are writable: this case tests nothing"
    tensors = micro_batch_tensors(decoded, layout)
    if layout is Layout.PACKED:  # the padded layout copies into a buffer of the capacity
        shared = [np.shares_memory(t["input_ids"].numpy(), decoded.tokens) for t in tensors if t["input_ids"].numel()]
        assert all(shared), "packed input_ids were copied"


@pytest.mark.kafka
def test_iterating_the_sink_warns_of_nothing(kafka_bootstrap: str, unique_name: str) -> None:
    rng = np.random.default_rng(5)
    write_steps(kafka_bootstrap, unique_name, [[random_batch(rng, s, 0, 1, 2, 256)] for s in range(3)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _ITERATE_THE_SINK, unique_name, kafka_bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"iterating the sink failed:\n{done.stderr}"
    result = json.loads(done.stdout)
    assert result["micro_batches"] == 6, result
    assert result["warnings"] == [], f"iterating the sink warned: {result['warnings']}"
