"""Copy micro-batches onto a GPU one ahead of the trainer, on a side stream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from trainer_sink.deliveries import Delivery


def to_device(deliveries: Iterator[Delivery], device: torch.device) -> Iterator[Delivery]:
    """``deliveries`` with their tensors on ``device``. Copying micro-batch ``i + 1`` (from pinned
    memory, asynchronously, on a stream of its own) overlaps the training step on micro-batch ``i``;
    the trainer's stream waits only for the copy of the batch it gets."""
    side = torch.cuda.Stream(device)

    def start_copy(delivery: Delivery) -> tuple[Delivery, torch.cuda.Event]:
        side.wait_stream(torch.cuda.current_stream(device))  # device memory freed by the trainer is reusable
        with torch.cuda.stream(side):
            tensors = {
                k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in delivery.tensors.items()
            }
            done = torch.cuda.Event()
            done.record(side)
        return replace(delivery, tensors=tensors), done

    pending = None
    for delivery in deliveries:
        following = start_copy(delivery)
        if pending is not None:
            yield _ready(*pending, device)
        pending = following
    if pending is not None:
        yield _ready(*pending, device)


def _ready(delivery: Delivery, done: torch.cuda.Event, device: torch.device) -> Delivery:
    current = torch.cuda.current_stream(device)
    current.wait_event(done)
    for value in delivery.tensors.values():
        if isinstance(value, torch.Tensor):
            value.record_stream(current)  # allocated on the side stream, used on the trainer's
    return delivery
