"""What every framework adapter checks of a job's steps against the run it feeds: as many data-parallel ranks.

A run with fewer data-parallel ranks than the job trains only their share of each step, and says nothing;
so each adapter checks the step of every micro-batch it hands on, before the framework trains it."""

from __future__ import annotations

from topics.errors import MixflowError
from trainer_sink.dataset import KafkaBatchDataset


def require_data_parallel_size(sink: KafkaBatchDataset, size: int, where: str) -> None:
    """Raise ``MixflowError`` unless the step of the micro-batch ``sink`` handed out last is laid out for ``size``
    data-parallel ranks; ``where`` names the framework's setting in the message ("Lightning's data-parallel
    size")."""
    ranks = sink.state_dict().get("ranks")
    if ranks is not None and ranks != size:
        msg = (
            f"{sink.topic} holds steps for {ranks} data-parallel ranks, but {where} is {size}: train on the job "
            f"replayed for {size} (mixflow replay --ranks {size}) or with {ranks} data-parallel ranks"
        )
        raise MixflowError(msg)
