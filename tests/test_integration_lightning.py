"""The Lightning integration (``MixflowDataModule``) with Lightning's own loop and checkpoints, 2 DDP
processes on CPU (gloo): a run killed by SIGKILL and resumed with ``ckpt_path="last"`` trains exactly the
micro-batches of an uninterrupted run, although Lightning reads a batch ahead of the one it trains, and a
checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every sample
trained exactly once (``tests.integration_base``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

from tests.integration_base import TrainerIntegration
from tests.integration_support import MICRO_BATCHES, SAVE_EVERY, STEPS, Jobs, write_jobs

pytestmark = pytest.mark.kafka


def _checkpoint(out: Path, step: int) -> Path:
    (path,) = (out / "checkpoints").glob(f"*step={step}.ckpt")
    return path


class TestLightning(TrainerIntegration):
    script = Path(__file__).resolve().parent / "integration_lightning_train.py"
    label = "lightning"
    killed_run_args = resume_args = ("--ckpt-path", "last")

    def resumed_at(self, out: Path) -> int:
        import torch

        last = out / "checkpoints" / "last.ckpt"
        assert last.exists(), "no checkpoint before the kill"
        return torch.load(last, map_location="cpu", weights_only=False)["global_step"]

    def copy_checkpoint(self, reference: Path, step: int, out: Path) -> tuple[str, ...]:
        return ("--ckpt-path", str(shutil.copy(_checkpoint(reference, step), out / "resume-from.ckpt")))

    def check_reference_checkpoints(self, reference: Path) -> None:
        for step in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
            assert _checkpoint(reference, step).exists()


# -- in this process, on one rank: what a resume must and must not do -----------------------------------------


class Killed(Exception):
    """Stands for a kill of the trainer in the middle of a step."""


@pytest.fixture(scope="module")
def loop_jobs(kafka_bootstrap: str) -> Jobs:
    return write_jobs(kafka_bootstrap, "lightning-loop", rank_counts=(1, 2))


def _fit(
    jobs: Jobs, out: Path, max_steps: int, *, ranks: int = 1, ckpt_path: str | None = None, module=None, killed_at=None
) -> tuple[Any, list[tuple[int, int, int]]]:
    """Lightning's ``fit`` in this process (one CPU device) on the job of ``ranks`` ranks, checkpointing to
    ``out`` as the README does (every 3 steps and ``last.ckpt``); a ``Killed`` raised before the micro-batch
    ``killed_at`` trains. The model and each micro-batch trained: (step, micro-batch, Lightning's global step)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.integration_lightning_train import TinyLanguageModel
    from trainer_sink import ReadOptions
    from trainer_sink.integrations.lightning_data import MixflowDataModule

    class Recording(TinyLanguageModel):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            if (batch["step"], batch["micro_batch"]) == killed_at:
                raise Killed
            trained.append((batch["step"], batch["micro_batch"], self.trainer.global_step))
            return super().training_step(batch, batch_idx)

    trained: list[tuple[int, int, int]] = []
    pl.seed_everything(0, verbose=False)
    model = Recording()
    data = (module or MixflowDataModule)(
        job=jobs.names[ranks], bootstrap_servers=jobs.bootstrap, read=ReadOptions(wait_timeout_s=60)
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, accumulate_grad_batches=MICRO_BATCHES,
        callbacks=[ModelCheckpoint(dirpath=out, every_n_train_steps=SAVE_EVERY, save_last=True)],
        default_root_dir=out, logger=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    finally:
        data.teardown("fit")
    return model, trained


def test_a_resume_after_a_checkpoint_in_the_middle_of_a_step_trains_that_step_whole(
    loop_jobs: Jobs, tmp_path: Path
) -> None:
    """Resumed at step 3, ``ModelCheckpoint`` saves ``last.ckpt`` again after the step's first micro-batch (it
    does not restore the step it last saved at); killed then and resumed, the run trains step 3 from its first
    micro-batch, each step's micro-batches before one optimizer step, and ends with the weights of a run never
    stopped."""
    import torch

    reference, _ = _fit(loop_jobs, tmp_path / "reference", 6)
    out = tmp_path / "stopped"
    _fit(loop_jobs, out, SAVE_EVERY)
    with pytest.raises(Killed):
        _fit(loop_jobs, out, 6, ckpt_path="last", killed_at=(SAVE_EVERY, 1))
    saved = torch.load(out / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == SAVE_EVERY
    assert (saved["MixflowDataModule"]["sink"]["step"], saved["MixflowDataModule"]["sink"]["micro_batch"]) == (3, 0)
    resumed, trained = _fit(loop_jobs, out, 6, ckpt_path="last")
    assert trained == [(step, m, step) for step in range(SAVE_EVERY, 6) for m in range(MICRO_BATCHES)]
    for (name, theirs), ours in zip(reference.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name


def test_a_checkpoint_without_the_modules_state_or_a_run_of_fewer_ranks_than_the_job_is_refused(
    loop_jobs: Jobs, tmp_path: Path
) -> None:
    """A subclass finds no state in a checkpoint of ``MixflowDataModule`` (Lightning keys it by class name);
    one process on a job of two ranks would train half of each step. Both refused before a batch trains."""
    from topics.errors import MixflowError
    from trainer_sink.integrations.lightning_data import MixflowDataModule

    class Renamed(MixflowDataModule):
        pass

    _fit(loop_jobs, tmp_path, SAVE_EVERY)
    with pytest.raises(MixflowError, match=r"holds no state of this data module .*Renamed'"):
        _fit(loop_jobs, tmp_path, 6, ckpt_path="last", module=Renamed, killed_at=(SAVE_EVERY, 0))
    with pytest.raises(MixflowError, match=r"holds steps for 2 data-parallel ranks.*replay --ranks 1"):
        _fit(loop_jobs, tmp_path / "two", 2, ranks=2, killed_at=(0, 0))
