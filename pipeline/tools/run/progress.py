"""A live view of a local job while it runs: steps the constructor has committed, steps the trainer has
trained, and which roles are still running."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import IO

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pipeline.tools.delivery import RECEIVED_FILE
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig

# How long one redraw may wait for the state topic's partitions before it exists.
LOOKUP_TIMEOUT_S = 1.0


class _StepsWritten:
    """The constructor's committed steps, from the keys of ``<job>.state`` (read_committed) in every
    partition (one per constructor lane): one past the highest step any lane has written. The topic's
    partitions are looked up until it exists (the constructor creates it)."""

    def __init__(self, config: KafkaConfig, job: str) -> None:
        self.topic = JobTopics(job).state
        self.consumer = Consumer(
            {
                **config,
                "group.id": f"mixflow-progress-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self.assigned = False
        self.steps = 0

    def _assign(self) -> None:
        try:
            described = self.consumer.list_topics(self.topic, timeout=LOOKUP_TIMEOUT_S).topics.get(self.topic)
        except KafkaException:
            return
        if described is not None and described.error is None and described.partitions:
            self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in described.partitions])
            self.assigned = True

    def poll(self) -> int:
        if not self.assigned:
            self._assign()
            if not self.assigned:
                return self.steps
        for message in self.consumer.consume(num_messages=10_000, timeout=0):
            if message.error() is None and message.key() is not None and message.key().isdigit():
                self.steps = max(self.steps, int(message.key()) + 1)
        return self.steps

    def close(self) -> None:
        self.consumer.close()


class _StepsTrained:
    """The trainer's completed steps: the slowest rank's received file, read as it grows. A step ends at its last
    micro-batch: the line's ``micro_batches`` (a context-parallel job's ranks run different numbers), or else
    the spec's."""

    def __init__(self, folder: Path, ranks: int, micro_batches: int) -> None:
        self.paths = [folder / RECEIVED_FILE.format(rank=r) for r in range(ranks)]
        self.files: list[IO[str] | None] = [None] * ranks
        self.done = [0] * ranks
        self.partial = [""] * ranks  # the start of a line the trainer is still writing
        self.micro_batches = micro_batches

    def poll(self) -> int:
        for r, path in enumerate(self.paths):
            if self.files[r] is None and path.exists():
                self.files[r] = path.open()
            handle = self.files[r]
            while handle is not None and (read := handle.readline()):
                line, self.partial[r] = self.partial[r] + read, ""
                if not line.endswith("\n"):
                    self.partial[r] = line  # read again, whole, once the trainer has written the rest
                    break
                record = json.loads(line)
                if record["micro_batch"] == record.get("micro_batches", self.micro_batches) - 1:
                    self.done[r] += 1
        return min(self.done)

    def close(self) -> None:
        for handle in self.files:
            if handle is not None:
                handle.close()


class JobProgress:
    """``update(running_roles)`` redraws; use as a context manager around the job."""

    def __init__(self, config: KafkaConfig, job: str, trainer: tuple[Path, int, int] | None) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed:>6.0f} steps"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.written = _StepsWritten(config, job)
        self.trained = _StepsTrained(*trainer) if trainer is not None else None
        self.write_task = self.progress.add_task("constructor: written", total=None, rate="")
        self.train_task = (
            self.progress.add_task("trainer: trained", total=None, rate="") if trainer is not None else None
        )
        self.roles_task = self.progress.add_task("", total=None, rate="", visible=False)

    def __enter__(self) -> JobProgress:
        self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.update([])
        self.progress.stop()
        self.written.close()
        if self.trained is not None:
            self.trained.close()

    def update(self, running: list[str]) -> None:
        self._set(self.write_task, self.written.poll())
        if self.trained is not None and self.train_task is not None:
            self._set(self.train_task, self.trained.poll())
        shown = ", ".join(running[:6]) + (f" +{len(running) - 6}" if len(running) > 6 else "")
        self.progress.update(self.roles_task, description=f"running: {shown}", visible=bool(running))

    def _set(self, task: int, steps: int) -> None:
        elapsed = self.progress.tasks[task].elapsed or 0.0
        rate = f"{steps / elapsed:5.1f} steps/s" if elapsed > 1 else ""
        self.progress.update(task, completed=steps, rate=rate)
