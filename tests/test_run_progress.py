"""``mixflow run``'s count of the steps a trainer completed, read from its received files as they grow: a
line the trainer is still writing when the count is taken is read whole once it is written."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tools.delivery import RECEIVED_FILE
from pipeline.tools.run.progress import _StepsTrained

MICRO_BATCHES = 3


def _lines(steps: int) -> str:
    return "".join(
        json.dumps({"step": step, "micro_batch": m, "tokens": 1000 + step}) + "\n"
        for step in range(steps)
        for m in range(MICRO_BATCHES)
    )


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 6), st.integers(1, 6), st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_steps_are_counted_whole_lines_at_a_time_however_the_writes_split_them(
    steps0: int, steps1: int, chunks: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        texts = [_lines(steps0), _lines(steps1)]
        paths = [Path(folder) / RECEIVED_FILE.format(rank=r) for r in range(2)]
        trained = _StepsTrained(Path(folder), ranks=2, micro_batches=MICRO_BATCHES)
        written = [0, 0]
        handles = [path.open("w") for path in paths]
        try:
            k = 0
            while written != [len(t) for t in texts]:
                for r, text in enumerate(texts):
                    size = chunks[k % len(chunks)]
                    k += 1
                    handles[r].write(text[written[r] : written[r] + size])
                    handles[r].flush()
                    written[r] = min(written[r] + size, len(text))
                complete = [text[: written[r]].count("\n") // MICRO_BATCHES for r, text in enumerate(texts)]
                assert trained.poll() == min(complete)
        finally:
            for handle in handles:
                handle.close()
            trained.close()
        assert min(complete) == min(steps0, steps1)
