"""Train the small GPT of ``examples/gpt.py`` on a mixflow job's rank topics, with DDP and exact resume.

    torchrun --nproc_per_node 2 examples/train.py --spec SPEC --out DIR [--steps N] [--checkpoint-every K]
    python examples/train.py --spec SPEC --out DIR          # one process: rank 0 of 1

Each data-parallel rank reads its own ``<job>.rank.<r>`` through ``trainer_sink.KafkaBatchDataset`` and
trains one global step per step of the job, accumulating gradients over the step's micro-batches
(``no_sync`` on all but the last). DDP runs on gloo on CPU and nccl on CUDA.

Loss normalisation: ranks hold different numbers of tokens, so each step's loss is the cross-entropy
summed over every label of every rank, divided by the labels of the whole global step (one
``all_reduce`` of the step's label count before its first micro-batch; with DDP averaging gradients
over ranks, each rank scales its sum by ``world_size / global labels``). Every label of the step weighs
the same, whichever rank or micro-batch holds it. The logged loss is that global mean.

Checkpoints (every ``--checkpoint-every`` steps and at the end) go to ``DIR/checkpoint/step-<N>/``:
``model.pt`` (model, optimizer, step; rank 0) and ``sink-rank<r>.json`` (the sink's ``state_dict()``,
each rank), then rank 0 points ``DIR/checkpoint/latest.json`` at it once every rank has written. Every
file is written to a temporary name and renamed into place, so a kill at any moment leaves the
previous checkpoint whole. ``--resume`` loads the latest and goes on from the next micro-batch.

Per rank, ``DIR/received-rank<r>.jsonl`` gets one line per micro-batch trained (step, micro_batch,
micro_batches, sample_ids, tokens_sha256 = sha256 of the samples' input_ids as little-endian int32, without the
padding that ``--pad-to-multiple-of`` adds), appended and flushed at each step, across kills and resumes;
``DIR/trainer-rank<r>.json`` sums up the run at its end.

The sink's tensors stay in (pinned) host memory: token hashes and label counts are read there without
waiting for the GPU, and each micro-batch is copied to the device asynchronously when it trains.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt  # examples/ is not a package: its folder goes on sys.path
import vlm

from trainer_sink import KafkaBatchDataset, MicroBatch, ReadOptions
from trainer_sink.config import SinkSource

log = logging.getLogger("train")

CHECKPOINTS_KEPT = 2


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the job spec (YAML): job, kafka and step are read")
    parser.add_argument(
        "--out", required=True, type=Path, help="checkpoints, received-rank<r>.jsonl, trainer-rank<r>.json"
    )
    parser.add_argument("--job", help="read this job's rank topics instead of the spec's job (as mixflow run --job)")
    parser.add_argument(
        "--bootstrap-servers", help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, then the spec)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="stop once this many global steps are trained (steps before a resume count); default: to the end of data",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="K", help="checkpoint every K steps (0: only at the end)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from DIR/checkpoint/latest.json (from the start when there is none yet)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--min-lr", type=float, default=3e-4, help="the learning rate decays to this (cosine) over --decay-steps"
    )
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--decay-steps", type=int, default=1000)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0: off)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the model's initial weights")
    parser.add_argument("--log-every-s", type=float, default=5.0, help="rank 0 logs progress this often")
    parser.add_argument(
        "--wait-timeout-s", type=float, default=600.0, help="give up when no step arrives for this long"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads per process (default: torch's choice)")
    parser.add_argument(
        "--pad-to-multiple-of",
        type=int,
        default=1,
        metavar="N",
        help="pad each micro-batch to a multiple of N tokens (64 suits NVIDIA tensor cores; 1: off)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="each process serves its sink's Prometheus metrics on this port plus its LOCAL_RANK (0: off)",
    )
    gpt.add_model_arguments(parser)
    vlm.add_vision_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 0:
        parser.error("--steps must not be negative")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must not be negative")
    return args


# -- distributed ----------------------------------------------------------------------------------------


class Group:
    """This process's place in the job: rank, world size, device; collectives that do nothing alone."""

    def __init__(self, device_kind: str | None) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        kind = device_kind or ("cuda" if torch.cuda.is_available() else "cpu")
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: CUDA is not available")
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        if self.world > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            options: dict[str, Any] = {"device_id": self.device} if backend == "nccl" else {}
            dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30), **options)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_reduce(self, values: list[float], dtype: torch.dtype = torch.float64) -> list[float]:
        tensor = torch.tensor(values, dtype=dtype, device=self.device)
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor.tolist()

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        if self.distributed:
            dist.destroy_process_group()


# -- files ----------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write: Any) -> None:
    """Write ``path`` through ``write(file)`` into a temporary name beside it, then rename it into place."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write(path, lambda file: file.write((json.dumps(value, indent=1) + "\n").encode()))


def _sample_tokens(micro_batch: MicroBatch) -> torch.Tensor:
    """The micro-batch's token ids without the sink's padding segment."""
    padding = int(micro_batch.get("padding_tokens", 0))
    ids = micro_batch["input_ids"]
    return ids[: ids.numel() - padding]


class ReceivedLog:
    """``received-rank<r>.jsonl``: one line per micro-batch trained, appended one step at a time with a
    single ``write`` (so a kill leaves whole steps), across kills and resumes."""

    def __init__(self, path: Path, *, append: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self.fd = os.open(path, flags, 0o644)
        size = os.fstat(self.fd).st_size
        if size:
            with open(path, "rb") as file:
                file.seek(size - 1)
                if file.read(1) != b"\n":
                    os.write(self.fd, b"\n")  # a line cut short by a kill stays on a line of its own
        self.pending: list[str] = []

    def add(self, micro_batch: MicroBatch) -> None:
        tokens = _sample_tokens(micro_batch).numpy().astype("<i4", copy=False).tobytes()
        line = {
            "step": micro_batch["step"],
            "micro_batch": micro_batch["micro_batch"],
            "micro_batches": micro_batch["micro_batches"],
            "sample_ids": list(micro_batch["sample_ids"]),
            "tokens_sha256": hashlib.sha256(tokens).hexdigest(),
        }
        self.pending.append(json.dumps(line) + "\n")

    def flush(self) -> None:
        if self.pending:
            os.write(self.fd, "".join(self.pending).encode())
            self.pending = []

    def close(self) -> None:
        """Close; lines of a step cut short by an error are not written (each step is flushed whole)."""
        os.close(self.fd)


# -- checkpoints ----------------------------------------------------------------------------------------


def checkpoint_root(out: Path) -> Path:
    return out / "checkpoint"


def save_checkpoint(
    out: Path,
    step: int,
    group: Group,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: KafkaBatchDataset,
    config: gpt.GPTConfig,
) -> None:
    """Checkpoint ``step`` (the steps trained so far): every rank writes its part, then rank 0 points
    latest.json at it and drops older checkpoints."""
    root = checkpoint_root(out)
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    sink = {"step": step, "rank": group.rank, "world_size": group.world, "sink": dataset.state_dict()}
    atomic_write_json(folder / f"sink-rank{group.rank}.json", sink)
    if group.rank == 0:
        state = {
            "step": step,
            "world_size": group.world,
            "config": asdict(config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        atomic_write(folder / "model.pt", lambda file: torch.save(state, file))
    group.barrier()  # every rank's part is in place before latest.json names the folder
    if group.rank == 0:
        atomic_write_json(root / "latest.json", {"step": step, "dir": folder.name, "world_size": group.world})
        kept = sorted(p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"step-\d{8}", p.name))
        for old in kept[:-CHECKPOINTS_KEPT]:
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    log.debug("rank %d: checkpoint at step %d in %s", group.rank, step, folder)


def load_checkpoint(out: Path, group: Group) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """``(step, model.pt's dict, this rank's sink state)`` of the latest checkpoint, or ``None``."""
    root = checkpoint_root(out)
    latest = root / "latest.json"
    if not latest.exists():
        return None
    info = json.loads(latest.read_text())
    # Checkpoints fall between steps, where any rank's sink state names the step to go on from; under
    # another world size (ranks of a job replayed with `mixflow replay --ranks`) the sink finds that step
    # on its own rank topic by number.
    saved_rank = min(group.rank, info["world_size"] - 1)
    if info["world_size"] != group.world:
        log.warning(
            "rank %d: %s was written by %d ranks, this run has %d: resuming from rank %d's sink state, by step",
            group.rank,
            latest,
            info["world_size"],
            group.world,
            saved_rank,
        )
    folder = root / info["dir"]
    state = torch.load(folder / "model.pt", map_location=group.device, weights_only=True)
    sink = json.loads((folder / f"sink-rank{saved_rank}.json").read_text())
    if state["step"] != info["step"] or sink["step"] != info["step"]:
        msg = f"checkpoint {folder} is inconsistent: latest.json, model.pt and sink-rank{saved_rank}.json disagree"
        raise SystemExit(msg)
    return info["step"], state, sink["sink"]


# -- training -------------------------------------------------------------------------------------------


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Linear warm-up over ``--warmup-steps``, then cosine decay to ``--min-lr`` over ``--decay-steps``."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min((step - args.warmup_steps) / max(args.decay_steps, 1), 1.0)
    return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def next_step(batches: Iterator[MicroBatch], step: int) -> list[MicroBatch]:
    """The micro-batches of global step ``step``, in order; ``[]`` at the end of the data."""
    micro_batches: list[MicroBatch] = []
    for micro_batch in batches:
        if (micro_batch["step"], micro_batch["micro_batch"]) != (step, len(micro_batches)):
            msg = (
                f"expected step {step} micro-batch {len(micro_batches)}, the sink gave step "
                f"{micro_batch['step']} micro-batch {micro_batch['micro_batch']}"
            )
            raise RuntimeError(msg)
        micro_batches.append(micro_batch)
        if micro_batch["micro_batch"] == micro_batch["micro_batches"] - 1:
            return micro_batches
    if micro_batches:
        msg = f"the data ended inside step {step} (after {len(micro_batches)} micro-batches)"
        raise RuntimeError(msg)
    return []


def memory_bytes() -> tuple[int, int]:
    """(RSS, PSS) of this process from /proc/self/smaps_rollup; (0, 0) where it cannot be read."""
    found = {"Rss": 0, "Pss": 0}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0]) * 1024
    return found["Rss"], found["Pss"]


def restore(
    args: argparse.Namespace,
    group: Group,
    config: gpt.GPTConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: KafkaBatchDataset,
) -> int:
    """With ``--resume``, load the latest checkpoint into the model, optimizer and sink; the step to
    train next (0 when there is nothing to resume)."""
    if not args.resume:
        if (checkpoint_root(args.out) / "latest.json").exists():
            msg = f"{args.out} already holds a checkpoint: pass --resume, or give another --out"
            raise SystemExit(msg)
        return 0
    loaded = load_checkpoint(args.out, group)
    if loaded is None:
        log.info("rank %d: no checkpoint in %s yet, starting at step 0", group.rank, checkpoint_root(args.out))
        return 0
    step, state, sink_state = loaded
    if state["config"] != asdict(config):
        msg = f"the checkpoint's model is {state['config']}, the flags ask for {asdict(config)}"
        raise SystemExit(msg)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    dataset.load_state_dict(sink_state)
    log.info("rank %d: resumed at step %d, sink at %s", group.rank, step, sink_state)
    return step


def train(args: argparse.Namespace, group: Group) -> dict[str, Any]:
    config = gpt.config_from_arguments(args)
    torch.manual_seed(args.seed)
    model: nn.Module = gpt.GPT(config)
    if args.vision:
        model = vlm.from_spec(model, args.spec, args)
    model = model.to(group.device)
    optimizer = make_optimizer(model, args)
    if group.rank == 0:
        log.info("%s on %s, %d rank(s)", gpt.describe(model), group.device, group.world)

    source = SinkSource.from_spec(args.spec, args.bootstrap_servers)
    job = args.job or source.job
    if source.ranks is not None and group.world > source.ranks:
        msg = f"the job has {source.ranks} data-parallel ranks, fewer than this run's {group.world} processes"
        raise SystemExit(msg)
    if source.ranks is not None and source.ranks != group.world and group.rank == 0:
        log.warning(
            "the job has %d data-parallel ranks, this run %d: it reads ranks 0..%d only",
            source.ranks,
            group.world,
            group.world - 1,
        )
    dataset = KafkaBatchDataset(
        job=job,
        kafka_config=source.kafka_config,
        global_rank=group.rank,
        world_size=group.world,
        metrics_port=args.metrics_port + int(os.environ.get("LOCAL_RANK", "0")) if args.metrics_port else None,
        read=ReadOptions(wait_timeout_s=args.wait_timeout_s, pad_to_multiple_of=args.pad_to_multiple_of),
    )

    args.out.mkdir(parents=True, exist_ok=True)
    step = restore(args, group, config, model, optimizer, dataset)
    first_step = step

    ddp: nn.Module = model
    if group.distributed:
        ddp = DistributedDataParallel(model, device_ids=[group.device.index] if group.device.type == "cuda" else None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if group.device.type == "cuda" else contextlib.nullcontext()
    received = ReceivedLog(args.out / f"received-rank{group.rank}.jsonl", append=args.resume)
    totals = {"steps": 0, "micro_batches": 0, "samples": 0, "tokens": 0}
    losses: list[float] = []
    started = last_log = time.monotonic()
    logged_tokens, global_tokens = 0, 0
    last_checkpoint = step
    batches = iter(dataset)
    try:
        while args.steps is None or step < args.steps:
            micro_batches = next_step(batches, step)
            if args.vision:
                micro_batches = [vlm.without_placeholder_labels(m, model.vision.config) for m in micro_batches]
            labels = sum(gpt.label_count(m) for m in micro_batches)
            tokens = sum(int(_sample_tokens(m).numel()) for m in micro_batches)
            if group.device.type == "cpu":
                for m in micro_batches:
                    if m["input_ids"].numel() and int(m["input_ids"].max()) >= config.vocab_size:
                        msg = f"step {step}: token id {int(m['input_ids'].max())} >= --vocab-size {config.vocab_size}"
                        raise SystemExit(msg)
            have = 1 if micro_batches else 0
            global_labels, step_tokens, ranks_with_data, step_sum = group.all_reduce(
                [labels, tokens, have, step * have]
            )
            if ranks_with_data == 0:
                break
            if ranks_with_data != group.world or step_sum != step * group.world:
                msg = f"step {step}: {int(ranks_with_data)} of {group.world} ranks got it (the rank topics disagree)"
                raise RuntimeError(msg)
            for param_group in optimizer.param_groups:
                param_group["lr"] = learning_rate(args, step)
            scale = group.world / max(global_labels, 1.0)
            step_loss = torch.zeros((), dtype=torch.float64, device=group.device)
            for i, micro_batch in enumerate(micro_batches):
                # Gradients are averaged over the ranks once, on the step's last micro-batch.
                final = i == len(micro_batches) - 1
                sync = contextlib.nullcontext() if final or not group.distributed else ddp.no_sync()
                with sync:
                    with autocast:
                        loss_sum, _ = gpt.loss_sum(ddp, micro_batch)
                    (loss_sum * scale).backward()
                step_loss += loss_sum.detach()
                received.add(micro_batch)
            if global_labels > 0:
                if args.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            (loss_total,) = group.all_reduce([float(step_loss)])
            loss_value = loss_total / max(global_labels, 1.0)
            losses.append(loss_value)
            received.flush()
            step += 1
            totals["steps"] += 1
            totals["micro_batches"] += len(micro_batches)
            totals["samples"] += sum(len(m["sample_ids"]) for m in micro_batches)
            totals["tokens"] += tokens
            global_tokens += int(step_tokens)
            now = time.monotonic()
            if group.rank == 0 and (now - last_log >= args.log_every_s or totals["steps"] == 1):
                rate = (global_tokens - logged_tokens) / max(now - last_log, 1e-9)
                log.info(
                    "step %d loss %.4f lr %.2e tokens/s %.0f (all ranks)",
                    step - 1,
                    loss_value,
                    learning_rate(args, step - 1),
                    rate,
                )
                last_log, logged_tokens = now, global_tokens
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(args.out, step, group, model, optimizer, dataset, config)
                last_checkpoint = step
        seconds = time.monotonic() - started
    finally:
        received.close()
        batches.close()  # closes the sink's reader, which settles peak_prefetch_bytes
    if step != last_checkpoint:
        save_checkpoint(args.out, step, group, model, optimizer, dataset, config)
    if group.rank == 0:
        shown = (_fmt(losses[0]), _fmt(losses[-1])) if losses else ("-", "-")
        log.info(
            "done: steps %d..%d, %d tokens on all ranks in %.1f s, loss %s -> %s",
            first_step,
            step - 1,
            global_tokens,
            seconds,
            *shown,
        )
    rss, pss = memory_bytes()
    return {
        "rank": group.rank,
        **totals,
        "first_step": first_step,
        "end_step": step,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(totals["tokens"] / seconds, 1) if seconds > 0 else 0.0,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "rss_bytes": rss,
        "pss_bytes": pss,
        "prefetch_peak_bytes": dataset.peak_prefetch_bytes,
    }


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    group = Group(args.device)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{group.rank} %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        summary = train(args, group)
        atomic_write_json(args.out / f"trainer-rank{group.rank}.json", summary)
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
