"""``KafkaBatchDataset``: one data-parallel rank's micro-batches, read from its rank topic."""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import IterableDataset, get_worker_info

from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.cluster_probe import require_rank_topic
from trainer_sink.config import SinkSource
from trainer_sink.device import to_device
from trainer_sink.metrics import SinkMetrics
from trainer_sink.parallel import ParallelLayout, rank_from_environment
from trainer_sink.position import SinkPosition
from trainer_sink.progress import ProgressReporter
from trainer_sink.read_options import READ_OPTION_NAMES, ReadOptions
from trainer_sink.reader import RankTopicReader
from trainer_sink.tensors import MicroBatch

log = logging.getLogger(__name__)


class KafkaBatchDataset(IterableDataset):
    """The micro-batches of one data-parallel rank, in order, as dicts of tensors (see
    ``trainer_sink.tensors`` for the keys), from ``<job>.rank.<r>``.

    Made from a job spec (``spec=``) or a job name and Kafka settings (``job=``, ``bootstrap_servers=``
    or ``kafka_config=``); with both ``spec=`` and ``job=``, the spec's Kafka settings for the job of that
    name (one run with ``mixflow run --job``, or replayed with ``mixflow replay --to-job``). The rank:
    ``rank=`` as the data-parallel rank, or ``global_rank=`` with ``world_size=`` and the
    tensor/context/pipeline-parallel sizes, or, with neither, ``RANK`` and ``WORLD_SIZE`` from the
    environment (``torchrun``) and those sizes; ``data_parallel_size`` is then the data-parallel size of
    that layout (``None`` with ``rank=``).

    Iterating yields every micro-batch after the current position and ends at the job's end-of-data
    record; iterating again continues where the last iteration stopped. ``state_dict()`` is the
    position after the last micro-batch handed out and ``load_state_dict()`` resumes there, exactly
    (the torchdata / ``torch.distributed.checkpoint`` Stateful convention).

    Resuming on another number of GPUs: replay the job under the new rank count (``mixflow replay
    --ranks R``), then load a saved state into each new rank's dataset of the replayed job. Data-parallel
    ranks train in lockstep, so all of them checkpoint at the same step, and any old rank's state will do
    for any new rank: a state saved on another rank topic resumes at its step, found there by step number.
    It must lie at a step boundary (the checkpoint taken after a whole step) when the number of ranks or
    micro-batches changed; a state in the middle of a step is refused then.

    A job built by several constructor lanes (``constructor.lanes``) has a rank-topic partition per lane;
    the dataset reads step ``k`` from partition ``k mod lanes`` and yields the steps in order, and its
    state holds the next step and micro-batch, found again in each partition by step number.

    ``read=ReadOptions(...)`` says how: the tensors' layout and padding (``pad_to_multiple_of`` pads each
    packed micro-batch with one padding segment to a multiple of that many tokens, which makes a GPU's matrix
    products faster: ``trainer_sink.tensors``), the read-ahead, and the patience. Its fields given as
    keywords of the dataset's own (``pad_to_multiple_of=64``) still work, with a ``DeprecationWarning``, for
    this release.

    A job with media (its batches have the ``media`` column) also yields each micro-batch's images and clips
    as a vision-language model takes them (``pixel_values``, ``image_grid_thw``, ``mrope_position_ids`` ...:
    ``trainer_sink.media_tensors``); ``ReadOptions.pixels`` sets the normalization and the encoder's patch
    sizes (Qwen2-VL's by default; made from a spec, the spec's vision sections' patch sizes, and ``pixels``
    with others is refused at once). Frames are decoded and normalized on the reading thread, ahead of the trainer.

    A background thread reads and decodes ahead, up to ``ReadOptions.prefetch_bytes``, pinning memory when
    CUDA is present. With ``device`` a CUDA device, the next micro-batch is copied there on a side stream while
    the current one trains. Use it without a DataLoader or under ``DataLoader(dataset,
    batch_size=None, pin_memory=True)`` with ``num_workers=0``: worker processes would each read the
    topic, and their positions would not reach ``state_dict()``.

    Metrics (``trainer_sink.metrics``: micro-batches and tokens handed out, the step, the trainer's wait
    for data, the prefetch queue's bytes) go into ``metrics_registry`` (to serve with the trainer's own) or
    a registry of the dataset's, which iterating serves at ``http://<host>:<metrics_port>/metrics`` when
    ``metrics_port`` is given (one port per process: under torchrun, a base port plus ``LOCAL_RANK``).

    With ``report_progress`` (the default) the dataset reports on ``<job>.progress`` each step its trainer
    has taken whole (``trainer_sink/progress.py``), so that a constructor with ``max_lead_steps`` stays
    at most that many steps ahead; a failure to report is logged, never raised.

    When the constructor is behind (or not running), the reader waits, logging at WARNING (shown by Python's
    default logging) every ``ReadOptions.wait_log_interval_s`` which step it waits for, and raises
    ``SinkTimeoutError`` after ``ReadOptions.wait_timeout_s``. A batch that does not decode
    raises ``DecodeError`` naming topic, partition and offset.
    """

    def __init__(
        self,
        spec: str | os.PathLike[str] | None = None,
        *,
        job: str | None = None,
        bootstrap_servers: str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        rank: int | None = None,
        global_rank: int | None = None,
        world_size: int | None = None,
        tensor_parallel: int = 1,
        context_parallel: int = 1,
        pipeline_parallel: int = 1,
        read: ReadOptions | None = None,
        device: torch.device | str | None = None,
        metrics_port: int | None = None,
        metrics_registry: CollectorRegistry | None = None,
        report_progress: bool = True,
        **read_options: Any,
    ) -> None:
        super().__init__()
        self.rank, self.data_parallel_size = _data_parallel_rank(
            rank, global_rank, world_size, tensor_parallel, context_parallel, pipeline_parallel
        )
        source = _source(spec, job, bootstrap_servers, kafka_config, self.rank)
        if source.context_parallel and context_parallel > 1:
            msg = (
                f"job {source.job} plans its context parallelism itself (step.context_parallel): every rank of the "
                "data x context mesh reads its own topic, so give context_parallel=1 (its step.ranks counts them all)"
            )
            raise MixflowError(msg)
        if source.ranks is not None and self.rank >= source.ranks:
            msg = f"data-parallel rank {self.rank} is not below the job's step.ranks ({source.ranks})"
            raise MixflowError(msg)
        self.job = source.job
        self.topic = JobTopics(source.job).rank(self.rank)
        self.kafka_config = dict(source.kafka_config)
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            msg = f"device {self.device} was asked for, but CUDA is not available"
            raise MixflowError(msg)
        read = _with_deprecated(read or ReadOptions(), read_options)
        pixels = source.pixel_options(read.pixels)
        # Fails fast, in one line: no broker answering (BrokerUnreachableError), no such job or rank (NotFoundError).
        require_rank_topic(self.kafka_config, self.job, self.rank)
        pin_memory = torch.cuda.is_available() if read.pin_memory is None else read.pin_memory
        self.options = replace(read, pixels=pixels, pin_memory=pin_memory)
        self._position = SinkPosition(self.topic)
        self._reader: RankTopicReader | None = None
        self._past_peak_bytes = 0
        self.metrics = SinkMetrics(metrics_registry or CollectorRegistry(), self.job, self.rank)
        self.metrics.measure_prefetch(lambda: self._reader.queue.used_bytes if self._reader is not None else 0)
        self._metrics_port = metrics_port
        self._report_progress = report_progress

    # -- Stateful ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: the next micro-batch to deliver and the offset to read from."""
        return self._position.to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume at a position ``state_dict()`` gave; the next iteration starts there.

        A state saved on another rank topic (another rank, or the job this one replays under another
        number of ranks) resumes at the same step and micro-batch, found here by step number. In the
        middle of a step that needs the same step shape on both topics; at a step boundary any shape will
        do, so after a change of world size every new rank may load any old rank's state."""
        if self._reader is not None:
            msg = "load_state_dict() while the dataset is being iterated; load it before iterating"
            raise MixflowError(msg)
        saved = SinkPosition.from_dict(state_dict)
        self._position = saved.on_topic(self.topic)
        if saved.topic != self.topic:
            log.info(
                "the sink state was saved on %s; resuming on %s at step %s micro-batch %d, found by step",
                saved.topic,
                self.topic,
                saved.step,
                saved.micro_batch,
            )

    # -- iteration -----------------------------------------------------------------------------------

    def __iter__(self) -> SinkIterator:
        worker = get_worker_info()
        if worker is not None:
            msg = (
                f"KafkaBatchDataset runs in DataLoader worker {worker.id} of {worker.num_workers}: use "
                "num_workers=0 (the sink reads and decodes on a thread of its own)"
            )
            raise MixflowError(msg)
        if self._reader is not None:
            msg = "the dataset is already being iterated; one iterator at a time (close the other first)"
            raise MixflowError(msg)
        if self._metrics_port:
            self.metrics.serve(self._metrics_port)
        self._reader = RankTopicReader(self.kafka_config, self._position, self.rank, self.options).start()
        progress = ProgressReporter(self.kafka_config, self.job, self.rank) if self._report_progress else None
        if progress is not None and self._position.step is not None:
            # Resumed: the checkpoint holds the steps before its own. Their report may have been lost with
            # the trainer that took them, and the constructor may wait for it before writing the next.
            progress.holds(self._position.step - 1)
        return SinkIterator(self, self._reader, progress)

    @property
    def peak_prefetch_bytes(self) -> int:
        """The most bytes the prefetch buffer has held, over every iteration so far."""
        live = self._reader.queue.peak_bytes if self._reader is not None else 0
        return max(self._past_peak_bytes, live)

    def _release(self, reader: RankTopicReader) -> None:
        if self._reader is reader:
            self._past_peak_bytes = max(self._past_peak_bytes, reader.queue.peak_bytes)
            self._reader = None


class SinkIterator(Iterator[MicroBatch]):
    """One pass over the stream. It moves the dataset's position as it hands micro-batches out, and
    stops the reader when it ends, is closed, or is dropped."""

    def __init__(self, dataset: KafkaBatchDataset, reader: RankTopicReader, progress: ProgressReporter | None) -> None:
        self._dataset = dataset
        self._reader = reader
        self._progress = progress
        deliveries = dataset.metrics.noting_tokens(reader.deliveries())
        if dataset.device is not None and dataset.device.type == "cuda":
            deliveries = to_device(deliveries, dataset.device)
        self._items = deliveries
        self._closed = False

    def __next__(self) -> MicroBatch:
        if self._closed:
            raise StopIteration
        try:
            began = time.perf_counter()
            delivery = next(self._items)
        except BaseException:
            self.close()
            raise
        dataset = self._dataset
        dataset._position = dataset._position.after(
            delivery.offset, delivery.step, delivery.micro_batch, delivery.micro_batches, delivery.ranks
        )
        dataset.metrics.handed_out(delivery, time.perf_counter() - began)
        if self._progress is not None:
            self._progress.handed_out(delivery.step, delivery.micro_batch, delivery.micro_batches)
        return delivery.tensors

    def close(self) -> None:
        """Stop reading ahead; what was prefetched and not handed out is not delivered."""
        if not self._closed:
            self._closed = True
            self._reader.close()
            if self._progress is not None:
                self._progress.close()
            self._dataset._release(self._reader)

    def __del__(self) -> None:
        self.close()


def _source(
    spec: str | os.PathLike[str] | None,
    job: str | None,
    bootstrap: str | None,
    config: Mapping[str, Any] | None,
    rank: int,
) -> SinkSource:
    if spec is not None:
        source = SinkSource.from_spec(spec, bootstrap, rank=rank)
        kafka = {**source.kafka_config, **(config or {})}
        if job is None or job == source.job:
            return SinkSource(source.job, kafka, source.ranks, source.patch_sizes)
        JobTopics(job)  # validates the name
        # Another job under the spec's settings: its ranks may not be the spec's (a replay under --ranks).
        return SinkSource(job, kafka, patch_sizes=source.patch_sizes)
    if job is None:
        msg = "give a job spec (spec=) or a job name (job=) to read from"
        raise MixflowError(msg)
    JobTopics(job)  # validates the name
    kafka = dict(config or {})
    if bootstrap:
        kafka["bootstrap.servers"] = bootstrap
    if not kafka.get("bootstrap.servers"):
        bootstrap_env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not bootstrap_env:
            msg = "no Kafka bootstrap servers: give bootstrap_servers= or set KAFKA_BOOTSTRAP_SERVERS"
            raise MixflowError(msg)
        kafka["bootstrap.servers"] = bootstrap_env
    return SinkSource(job, kafka)


def _data_parallel_rank(
    rank: int | None, global_rank: int | None, world_size: int | None, tensor: int, context: int, pipeline: int
) -> tuple[int, int | None]:
    """``(data-parallel rank, data-parallel size)``; the size is ``None`` when the rank is given as it is."""
    if rank is not None:
        if global_rank is not None or world_size is not None:
            msg = "give rank= (the data-parallel rank) or global_rank= with world_size=, not both"
            raise MixflowError(msg)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            msg = f"rank must be a non-negative int, not {rank!r}"
            raise MixflowError(msg)
        return rank, None
    if global_rank is not None or world_size is not None:
        if global_rank is None or world_size is None:
            msg = "global_rank= and world_size= go together"
            raise MixflowError(msg)
        layout = ParallelLayout(world_size, tensor, context, pipeline)
        return layout.data_parallel_rank(global_rank), layout.data_parallel
    return rank_from_environment(tensor=tensor, context=context, pipeline=pipeline)


def _with_deprecated(read: ReadOptions, keywords: Mapping[str, Any]) -> ReadOptions:
    """``read`` with the options given as ``KafkaBatchDataset``'s own keywords, as before ``read=``."""
    if not keywords:
        return read
    unknown = sorted(set(keywords) - READ_OPTION_NAMES)
    if unknown:
        msg = f"KafkaBatchDataset() got an unexpected keyword argument {unknown[0]!r}"
        raise TypeError(msg)
    given = ", ".join(f"{name}=..." for name in keywords)
    warnings.warn(
        f"KafkaBatchDataset({given}) is deprecated and goes in the next release: pass read=ReadOptions({given})",
        DeprecationWarning,
        stacklevel=3,
    )
    return replace(read, **keywords)
