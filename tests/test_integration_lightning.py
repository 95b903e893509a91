"""The Lightning integration (``MixflowDataModule``) with Lightning's own loop and checkpoints, 2 DDP
processes on CPU (gloo): a run killed by SIGKILL and resumed with ``ckpt_path="last"`` trains exactly the
micro-batches of an uninterrupted run, although Lightning reads a batch ahead of the one it trains, and a
checkpoint taken at 2 ranks resumes on the same samples laid out for 1 and for 3 ranks with every sample
trained exactly once (``tests.integration_base``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from tests.integration_base import TrainerIntegration
from tests.integration_support import SAVE_EVERY, STEPS

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
