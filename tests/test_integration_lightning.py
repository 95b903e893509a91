"""The Lightning integration (``MixflowDataModule``) with Lightning's own loop and checkpoints, 2 DDP
processes on CPU (gloo): a run killed by SIGKILL and resumed with ``ckpt_path="last"`` trains exactly the
micro-batches of an uninterrupted run, although Lightning reads a batch ahead of the one it trains, and a
checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every sample
trained exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from tests.integration_support import (
    MICRO_BATCHES,
    SAVE_EVERY,
    STEPS,
    Jobs,
    finish,
    kill_rank_after,
    received,
    start,
    write_jobs,
)

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).resolve().parent / "integration_lightning_train.py"


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "lightning")


def _run(jobs: Jobs, ranks: int, out: Path, *extra: str):
    job = ("--job", jobs.names[ranks], "--bootstrap", jobs.bootstrap)
    return start(SCRIPT, ranks, out, *job, "--out", str(out), *extra)


@pytest.fixture(scope="module")
def reference(jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run at 2 ranks to the end of the data."""
    out = tmp_path_factory.mktemp("lightning-reference")
    finish(_run(jobs, 2, out), out)
    return out


def _checkpoint(out: Path, step: int) -> Path:
    (path,) = (out / "checkpoints").glob(f"*step={step}.ckpt")
    return path


def test_the_uninterrupted_run_trains_exactly_its_rank_topics(jobs: Jobs, reference: Path) -> None:
    for rank in range(2):
        assert received(reference / f"received-rank{rank}.jsonl") == jobs.topics[2][rank], f"rank {rank}"
    for step in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
        assert _checkpoint(reference, step).exists()


def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
    jobs: Jobs, reference: Path, tmp_path: Path
) -> None:
    import torch

    out = tmp_path / "killed"
    # Killed in step 7, after the checkpoint of step 6: step 6 was trained once already.
    kill_rank_after(_run(jobs, 2, out, "--ckpt-path", "last"), out, rank=1, lines=7 * MICRO_BATCHES + 1)
    logs = [out / f"received-rank{r}.jsonl" for r in range(2)]
    sizes = [path.stat().st_size for path in logs]
    last = out / "checkpoints" / "last.ckpt"
    assert last.exists(), "no checkpoint before the kill"
    resumed_at = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    finish(_run(jobs, 2, out, "--ckpt-path", "last"), out)
    for rank in range(2):
        expected = [r for r in received(reference / f"received-rank{rank}.jsonl") if r[0] >= resumed_at]
        assert received(logs[rank], sizes[rank]) == expected, f"rank {rank} resumed at step {resumed_at} differs"


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_checkpoint_at_two_ranks_resumes_on_another_number_of_ranks(
    jobs: Jobs, reference: Path, tmp_path: Path, ranks: int
) -> None:
    at = 2 * SAVE_EVERY
    out = tmp_path / f"at-{ranks}"
    out.mkdir()
    saved = shutil.copy(_checkpoint(reference, at), out / "resume-from.ckpt")
    finish(_run(jobs, ranks, out, "--ckpt-path", str(saved)), out)
    before = [r for rank in range(2) for r in received(reference / f"received-rank{rank}.jsonl") if r[0] < at]
    after = [r for rank in range(ranks) for r in received(out / f"received-rank{rank}.jsonl")]
    for rank in range(ranks):
        expected = [r for r in jobs.topics[ranks][rank] if r[0] >= at]
        assert received(out / f"received-rank{rank}.jsonl") == expected, f"rank {rank} of {ranks}"
    trained = [sample for record in before + after for sample in record[2]]
    every = [sample for topic in jobs.topics[1].values() for record in topic for sample in record[2]]
    assert sorted(trained) == sorted(every) and len(set(trained)) == len(trained)
