"""The tests every trainer integration passes, written once: a framework's test file subclasses
``TrainerIntegration`` as ``Test<Framework>`` and says where its training script keeps checkpoints.

Each framework trains with its own loop and checkpointing under torchrun, 2 data-parallel processes on CPU
(gloo), over the jobs of ``tests.integration_support`` (the same samples laid out for 1, 2 and 3 ranks):

- an uninterrupted run at 2 ranks trains exactly its rank topics, micro-batch by micro-batch;
- a run killed by SIGKILL in step 7 (after the checkpoint of step 6) and resumed with the framework's own
  resume trains exactly the micro-batches of the uninterrupted run from the checkpointed step on;
- a checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks (what ``mixflow
  replay --ranks`` makes of a job), each rank training exactly its topic from that step on and every sample
  trained exactly once over the two runs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import ClassVar

import pytest

from tests.integration_support import (
    MICRO_BATCHES,
    SAVE_EVERY,
    Jobs,
    finish,
    kill_rank_after,
    received,
    start,
    write_jobs,
)

KILLED_AT_STEP = 7
RESUMED_FROM_STEP = 2 * SAVE_EVERY


class TrainerIntegration:
    """The shared tests; a subclass names its ``script`` and ``label`` and implements the checkpoint hooks."""

    script: ClassVar[Path]
    label: ClassVar[str]
    killed_run_args: ClassVar[tuple[str, ...]] = ()
    """Arguments of the run that is killed (resuming, should it find a checkpoint)."""
    resume_args: ClassVar[tuple[str, ...]] = ()
    """Arguments of the run that resumes the killed one from its last checkpoint."""

    def resumed_at(self, out: Path) -> int:
        """The step the framework resumes ``out``'s run from: that of its last whole checkpoint."""
        raise NotImplementedError

    def copy_checkpoint(self, reference: Path, step: int, out: Path) -> tuple[str, ...]:
        """Copy the reference run's checkpoint of ``step`` into ``out``; the arguments that resume from it."""
        raise NotImplementedError

    def check_reference_checkpoints(self, reference: Path) -> None:
        """What the uninterrupted run's checkpoints must be."""

    @classmethod
    def run(cls, jobs: Jobs, ranks: int, out: Path, *extra: str) -> subprocess.Popen:
        """The training script on the job laid out for ``ranks`` ranks, one process per rank."""
        job = ("--job", jobs.names[ranks], "--bootstrap", jobs.bootstrap)
        return start(cls.script, ranks, out, *job, "--out", str(out), *extra)

    @pytest.fixture(scope="class")
    @classmethod
    def jobs(cls, kafka_bootstrap: str) -> Jobs:
        return write_jobs(kafka_bootstrap, cls.label)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """One uninterrupted run at 2 ranks to the end of the data."""
        out = tmp_path_factory.mktemp(f"{cls.label}-reference")
        finish(cls.run(jobs, 2, out), out)
        return out

    def test_the_uninterrupted_run_trains_exactly_its_rank_topics(self, jobs: Jobs, reference: Path) -> None:
        for rank in range(2):
            assert received(reference / f"received-rank{rank}.jsonl") == jobs.topics[2][rank], f"rank {rank}"
        self.check_reference_checkpoints(reference)

    def test_a_killed_run_resumes_with_exactly_the_micro_batches_of_an_uninterrupted_one(
        self, jobs: Jobs, reference: Path, tmp_path: Path
    ) -> None:
        out = tmp_path / "killed"
        lines = KILLED_AT_STEP * MICRO_BATCHES + 1
        kill_rank_after(self.run(jobs, 2, out, *self.killed_run_args), out, rank=1, lines=lines)
        logs = [out / f"received-rank{r}.jsonl" for r in range(2)]
        sizes = [path.stat().st_size for path in logs]
        resumed_at = self.resumed_at(out)
        finish(self.run(jobs, 2, out, *self.resume_args), out)
        for rank in range(2):
            expected = [r for r in received(reference / f"received-rank{rank}.jsonl") if r[0] >= resumed_at]
            assert received(logs[rank], sizes[rank]) == expected, f"rank {rank} resumed at step {resumed_at} differs"

    @pytest.mark.parametrize("ranks", [1, 3])
    def test_a_checkpoint_at_two_ranks_resumes_on_another_number_of_ranks(
        self, jobs: Jobs, reference: Path, tmp_path: Path, ranks: int
    ) -> None:
        at = RESUMED_FROM_STEP
        out = tmp_path / f"at-{ranks}"
        out.mkdir()
        finish(self.run(jobs, ranks, out, *self.copy_checkpoint(reference, at, out)), out)
        before = [r for rank in range(2) for r in received(reference / f"received-rank{rank}.jsonl") if r[0] < at]
        after = [r for rank in range(ranks) for r in received(out / f"received-rank{rank}.jsonl")]
        for rank in range(ranks):
            expected = [r for r in jobs.topics[ranks][rank] if r[0] >= at]
            assert received(out / f"received-rank{rank}.jsonl") == expected, f"rank {rank} of {ranks}"
        trained = [sample for record in before + after for sample in record[2]]
        every = [sample for topic in jobs.topics[1].values() for record in topic for sample in record[2]]
        assert sorted(trained) == sorted(every) and len(set(trained)) == len(trained)
