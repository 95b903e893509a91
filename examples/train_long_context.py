"""Train the small GPT of ``examples/gpt.py`` on a context-parallel job, one process per rank of its data x context
mesh, on CPU (gloo):

    torchrun --nproc_per_node 4 examples/train_long_context.py --spec examples/long_context.yaml --out DIR

The job's spec sets ``step.context_parallel`` (``examples/long_context.yaml``), so the constructor decides every
step which long samples span a block of ranks, and each rank's topic ``<job>.rank.<r>`` holds only its slices
(format version 3). Each rank reads its own topic through ``trainer_sink.KafkaBatchDataset`` and runs its
micro-batches of a step in order; a micro-batch of a block of ``c > 1`` ranks all-gathers the block's keys and
values in each layer (``cp_attention``), one of ``c == 1`` runs alone. Loss: each token's cross-entropy divided by
the step's loss tokens over every rank (``loss_tokens``); at the step's end every rank all-reduces (sums) its
gradients, a rank with fewer micro-batches too, and takes the optimizer step.

Rank 0 logs the loss; at the end every rank's received slices go to rank 0, which reassembles each sample from
its block's slices and compares it with the samples on the source topics (``cp_delivery``). ``DIR`` gets
``received-rank<r>.jsonl`` (one line per micro-batch: step, micro_batch, micro_batches, sample_ids,
tokens_sha256) and ``trainer-rank<r>.json`` (the run's summary; rank 0's with every step's loss and the delivery
check), as ``mixflow run``'s report reads them; the last line of rank 0's output sums them up as JSON. No
checkpoints: a restarted run starts over.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cp_attention  # examples/ is not a package: its folder goes on sys.path
import cp_delivery
import gpt
import train

from pipeline.spec import JobSpec, load_spec
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.log_reader import read_to_end
from trainer_sink import KafkaBatchDataset, MicroBatch, ReadOptions
from trainer_sink.config import SinkSource

log = logging.getLogger("train_long_context")


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the job spec; its step sets context_parallel")
    parser.add_argument("--out", required=True, type=Path, help="received-rank<r>.jsonl and trainer-rank<r>.json")
    parser.add_argument("--bootstrap-servers", help="default: $KAFKA_BOOTSTRAP_SERVERS, then the spec")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: the end of the data)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--min-lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--decay-steps", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0: off)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the model's initial weights (every rank's)")
    parser.add_argument("--log-every-s", type=float, default=5.0, help="rank 0 logs the loss this often")
    parser.add_argument("--wait-timeout-s", type=float, default=600.0, help="give up when no step comes for this long")
    parser.add_argument("--threads", type=int, help="torch CPU threads per process (default: torch's choice)")
    gpt.add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 0:
        parser.error("--steps must not be negative")
    return args


def micro_batch_loss(
    model: gpt.GPT, micro_batch: MicroBatch, blocks: cp_attention.BlockGroups, rank: int
) -> torch.Tensor:
    """The summed cross-entropy of the micro-batch's labels (those not ``-100``)."""
    attend = cp_attention.BlockAttention(micro_batch, blocks.of(rank, micro_batch))
    logits = model(
        input_ids=micro_batch["input_ids"].long(),
        position_ids=micro_batch["position_ids"].long(),
        cu_seqlens=micro_batch["cu_seqlens"],
        max_seqlen=int(micro_batch["max_seqlen"]),
        attend=attend,
    )
    return F.cross_entropy(logits, micro_batch["labels"], ignore_index=gpt.IGNORE_INDEX, reduction="sum")


def all_reduce_gradients(model: nn.Module) -> None:
    """Sum every parameter's gradient over all ranks, in one flat tensor (a parameter without one counts 0)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters])
    dist.all_reduce(flat)
    for parameter, grad in zip(parameters, flat.split([p.numel() for p in parameters]), strict=True):
        parameter.grad = grad.view_as(parameter)


def source_samples(config: Mapping[str, Any], job: str, sources: list[str]) -> dict[str, np.ndarray]:
    """Every sample the loaders committed to the job's source topics, by id."""
    samples = {}
    for source in sources:
        for message in read_to_end(config, JobTopics(job).src(source)):
            sample = decode_sample_message(message)
            samples[sample.sample_id] = np.asarray(sample.tokens)
    return samples


class Received:
    """What this rank received: its received file (a line per micro-batch), its slices for the delivery check, its
    tokens, and the micro-batches it ran as the first rank of their block, by the block's ranks."""

    def __init__(self, out: Path, rank: int, largest_block: int) -> None:
        self.rank = rank
        self.log = train.ReceivedLog(out / f"received-rank{rank}.jsonl", append=False)
        self.slices: list[cp_delivery.Slice] = []
        self.tokens = 0
        self.by_block = torch.zeros(largest_block + 1, dtype=torch.float64)

    def add(self, micro_batch: MicroBatch) -> None:
        self.log.add(micro_batch)
        self.slices += cp_delivery.micro_batch_slices(self.rank, micro_batch)
        self.tokens += int(micro_batch["input_ids"].numel())
        if micro_batch["input_ids"].numel() and micro_batch["cp_rank"] == 0:
            self.by_block[int(micro_batch["local_cp_size"])] += 1


def train_step(
    model: gpt.GPT,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[MicroBatch],
    blocks: cp_attention.BlockGroups,
    rank: int,
    grad_clip: float,
) -> float:
    """Run this rank's micro-batches of a step and take the optimizer step; this rank's summed token losses."""
    loss_tokens = max(int(micro_batches[0]["loss_tokens"]), 1)
    step_loss = 0.0
    # Deadlock-free: a block's micro-batch sits at the same index of the step on every rank of the block, and every
    # rank runs its micro-batches in index order, so the ranks of a block meet in each of its collectives (forward
    # and backward) in the same order; a micro-batch of one rank has none, and a rank with fewer micro-batches goes
    # on to the step's gradient all-reduce, which every rank joins once.
    for micro_batch in micro_batches:
        if micro_batch["input_ids"].numel():  # not the empty micro-batch of a rank with none in the step
            loss_sum = micro_batch_loss(model, micro_batch, blocks, rank)
            (loss_sum / loss_tokens).backward()
            step_loss += float(loss_sum.detach())
    all_reduce_gradients(model)
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss


def train_job(args: argparse.Namespace, group: train.Group) -> dict[str, Any]:
    spec = load_spec(args.spec)
    cp = spec.step.context_parallel
    if cp is None:
        raise SystemExit(f"{args.spec}: the step has no context_parallel section; train it with examples/train.py")
    if group.world != spec.step.ranks or not group.distributed:
        msg = (
            f"{args.spec}: the job's step has {spec.step.ranks} ranks (data x context), this run {group.world} "
            "processes: run one process per rank under torchrun"
        )
        raise SystemExit(msg)
    blocks = cp_attention.BlockGroups(cp.mode, cp.size, group.world)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = gpt.GPT(gpt.config_from_arguments(args))
    optimizer = train.make_optimizer(model, args)
    if group.rank == 0:
        log.info("%s; %d ranks, context parallelism %s up to %d", gpt.describe(model), group.world, cp.mode, cp.size)
    dataset = KafkaBatchDataset(
        args.spec,
        bootstrap_servers=args.bootstrap_servers,
        global_rank=group.rank,
        world_size=group.world,
        read=ReadOptions(wait_timeout_s=args.wait_timeout_s),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    received = Received(args.out, group.rank, cp.size)
    losses: list[float] = []
    step = 0
    started = last_log = time.monotonic()
    batches = iter(dataset)
    try:
        while args.steps is None or step < args.steps:
            micro_batches = train.next_step(batches, step)
            have = 1 if micro_batches else 0
            ranks_with_data, step_sum = group.all_reduce([have, step * have])
            if ranks_with_data == 0:
                break
            if ranks_with_data != group.world or step_sum != step * group.world:
                raise RuntimeError(f"step {step}: {int(ranks_with_data)} of {group.world} ranks got it")
            for param_group in optimizer.param_groups:
                param_group["lr"] = train.learning_rate(args, step)
            step_loss = train_step(model, optimizer, micro_batches, blocks, group.rank, args.grad_clip)
            for micro_batch in micro_batches:
                received.add(micro_batch)
            received.log.flush()
            (loss_total,) = group.all_reduce([step_loss])
            losses.append(loss_total / max(int(micro_batches[0]["loss_tokens"]), 1))
            step += 1
            now = time.monotonic()
            if group.rank == 0 and (now - last_log >= args.log_every_s or step == 1):
                log.info("step %d loss %.4f lr %.2e", step - 1, losses[-1], train.learning_rate(args, step - 1))
                last_log = now
        seconds = time.monotonic() - started
        to_the_end = args.steps is None or step < args.steps
    finally:
        received.log.close()
        batches.close()
    dist.all_reduce(received.by_block)
    source = SinkSource.from_spec(args.spec, args.bootstrap_servers, rank=group.rank)
    delivery = _check_delivery(group, received.slices, source.kafka_config, spec, to_the_end=to_the_end)
    rss, pss = train.memory_bytes()
    summary = {
        "rank": group.rank,
        "steps": step,
        "end_step": step,
        "tokens": received.tokens,
        "seconds": round(seconds, 3),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(losses[-1], 4) if losses else None,
        "rss_bytes": rss,
        "pss_bytes": pss,
        "prefetch_peak_bytes": dataset.peak_prefetch_bytes,
    }
    if group.rank == 0:
        by_block = {c: int(n) for c, n in enumerate(received.by_block.tolist()) if n}
        log.info("micro-batches by the ranks of their block: %s", by_block)
        log.info("loss %s at the first step, %s at the last (%d steps, %.1f s)", *_shown(losses), step, seconds)
        log.info(delivery.line())
        summary |= {"losses": [round(x, 4) for x in losses], "micro_batches_by_block": by_block}
        summary |= {"exactly_once": delivery.ok, "delivery": delivery.line()}
    return summary


def _shown(losses: list[float]) -> tuple[str, str]:
    return (f"{losses[0]:.4f}", f"{losses[-1]:.4f}") if losses else ("-", "-")


def _check_delivery(
    group: train.Group, slices: list[cp_delivery.Slice], config: Mapping[str, Any], spec: JobSpec, *, to_the_end: bool
) -> cp_delivery.DeliveryCheck:
    """Rank 0's check of every rank's received slices against the source topics (the others get a blank)."""
    gathered: list[Any] = [None] * group.world if group.rank == 0 else []
    dist.gather_object(slices, gathered if group.rank == 0 else None, dst=0)
    if group.rank != 0:
        return cp_delivery.DeliveryCheck(0, 0, to_the_end)
    sources = source_samples(config, spec.job, spec.source_names)
    return cp_delivery.check_delivery((s for rank in gathered for s in rank), sources, to_the_end=to_the_end)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    group = train.Group("cpu")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{group.rank} %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        summary = train_job(args, group)
        train.atomic_write_json(args.out / f"trainer-rank{group.rank}.json", summary)
        group.barrier()
        if group.rank == 0:  # mixflow run shows a role's last line: train: {...}
            shown = ("steps", "seconds", "loss_first", "loss_last", "micro_batches_by_block", "delivery")
            print(json.dumps({key: summary[key] for key in shown}), flush=True)
    finally:
        group.close()
    return 0 if summary.get("exactly_once", True) else 1


if __name__ == "__main__":
    sys.exit(main())
