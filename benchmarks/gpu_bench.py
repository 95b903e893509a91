"""GPU checks, one script for one short lease of a GPU machine.

1. **The sink under a training step.** The example model (examples/gpt.py, sized for a GPU) trains on
   one rank's micro-batches three ways, same micro-batches, same order:
   - *sink*: the trainer sink's reading thread (decode, tensors, pinned memory, byte-bounded queue)
     and its side-stream copy onto the GPU, one micro-batch ahead (``trainer_sink.device.to_device``);
   - *raw*: the same micro-batches decoded beforehand into pinned memory, each copied with a plain
     ``.to(device, non_blocking=True)`` just before its step;
   - *resident*: already on the GPU (no data path at all).
   Reported: median step time of each, and the sink's overhead over *resident* (target: under 2%).
   The GPU machine has no Kafka broker (no Java there), so the sink's reader is fed the rank topic's
   records as recorded here (``--record``) instead of from a consumer: everything after the consumer's
   poll is the production code path.
2. **Block timings for the cost model.** What ``mixflow calibrate`` measures (``pipeline.tools.calibrate``):
   one transformer block (hidden 4096, 32 heads, bf16, varlen causal attention, MLP 4x), forward and
   backward, over micro-batches of 64k and 32k tokens made of equal samples of length L, for L from
   256 to 64k, and the fit ``t(L) = alpha*L^2 + beta*L + gamma`` per sample plus a constant per
   micro-batch (the cost model the scheduler balances).

3. **Planned steps on real blocks.** The micro-batches that naive per-rank loading, the in-order draw
   and composed steps give on the same arrival stream (``balance_sim_bench.py --export-plans``), each timed
   as one forward and backward of the block above over its packed samples (varlen ``cu_seqlens``). A rank's
   step time is the sum of its micro-batches', a step waits for its slowest rank. Reported per context and
   method: tokens/s and its ratio to naive, the median max/mean rank time, fill, and the same from the cost
   model's prediction for the same micro-batches (how far the simulator is from the GPU).

Record on a machine with the broker, then run on the GPU machine:

    .venv/bin/python -m benchmarks.gpu_bench --record --job JOB --rank 0 --out .gpu/rank0.pkl
    .venv/bin/python -m benchmarks.balance_sim_bench --export-plans .gpu/plans.json --steps 8
    python3 -m benchmarks.gpu_bench --messages .gpu/rank0.pkl --plans .gpu/plans.json --out $OUT
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def record(job: str, rank: int, bootstrap: str, out: Path) -> None:
    from topics.formats.names import JobTopics
    from topics.kafka.log_reader import read_to_end

    messages = read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(rank))
    rows = [(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers()) for m in messages]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(pickle.dumps(rows))
    print(f"recorded {len(rows)} records of {JobTopics(job).rank(rank)} into {out} ({out.stat().st_size} bytes)")


# -- 1. the sink under a training step --------------------------------------------------------------------


def _replay_reader(rows: list[tuple], rank: int) -> Any:
    from confluent_kafka import Message

    from trainer_sink.position import SinkPosition
    from trainer_sink.read_options import ReadOptions
    from trainer_sink.reader import RankTopicReader

    class ReplayReader(RankTopicReader):
        def _run(self) -> None:
            messages = (Message(topic=t, partition=p, offset=o, key=k, value=v, headers=h) for t, p, o, k, v, h in rows)
            try:
                self._hand_over_steps(self.steps.one_lane(messages))
            except BaseException as exc:
                self._hand_over(exc)

    return ReplayReader({"bootstrap.servers": "unused"}, SinkPosition(rows[0][0]), rank, ReadOptions(pin_memory=True))


def sink_under_training(rows: list[tuple], rank: int, steps: int, repeats: int) -> dict[str, Any]:
    import torch

    from examples import gpt
    from trainer_sink.device import to_device

    device = torch.device("cuda")
    torch.manual_seed(0)
    config = gpt.GPTConfig(vocab_size=8192, d_model=1024, n_layers=8, n_heads=16)
    model = gpt.GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    print(gpt.describe(model), flush=True)

    def host_micro_batches() -> list[dict]:
        reader = _replay_reader(rows, rank).start()
        try:
            return [d.tensors for d in reader.deliveries()]
        finally:
            reader.close()

    pinned = host_micro_batches()
    micro_batches = pinned[0]["micro_batches"]
    pinned = pinned[: steps * micro_batches]
    resident = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in mb.items()} for mb in pinned]

    def train(micro_batches_in: Any) -> list[float]:
        """Seconds per step (wall, synchronised at step boundaries)."""
        times, began = [], None
        for i, mb in enumerate(micro_batches_in):
            if i % micro_batches == 0:
                torch.cuda.synchronize()
                began = time.perf_counter()
            gpt.loss(model, mb).backward()
            if i % micro_batches == micro_batches - 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - began)
            if i + 1 == steps * micro_batches:
                break
        return times

    def sink_arm() -> Any:
        reader = _replay_reader(rows, rank).start()
        try:
            yield from (d.tensors for d in to_device(reader.deliveries(), device))
        finally:
            reader.close()

    def raw_arm() -> Any:
        for mb in pinned:
            yield {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}

    arms = {"resident": lambda: iter(resident), "raw": raw_arm, "sink": sink_arm}
    train(iter(resident))  # warm-up: kernels, allocator, autotuning
    results: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, make in arms.items():
            results[name] += train(make())[2:]  # the first steps of each pass refill the caches
    medians = {name: statistics.median(times) for name, times in results.items()}
    tokens = sum(int(mb["input_ids"].numel()) for mb in pinned) / steps
    out = {
        "model": gpt.describe(model),
        "micro_batches_per_step": micro_batches,
        "tokens_per_step": tokens,
        "steps_timed": {name: len(times) for name, times in results.items()},
        "median_step_ms": {name: 1000 * m for name, m in medians.items()},
        "sink_overhead_vs_resident": medians["sink"] / medians["resident"] - 1,
        "raw_overhead_vs_resident": medians["raw"] / medians["resident"] - 1,
        "sink_vs_raw": medians["sink"] / medians["raw"] - 1,
    }
    return out


# -- 2. block timings -------------------------------------------------------------------------------------


def block_timings(lengths: list[int], tokens: int, repeats: int) -> dict[str, Any]:
    """What ``mixflow calibrate --hidden 4096 --heads 32 --layers 1`` measures and fits, as JSON."""
    from pipeline.tools.calibrate import calibration_grid, fit_cost, fit_table
    from pipeline.tools.calibrate.timing import measure

    hidden, heads = 4096, 32
    shapes = calibration_grid(lengths, tokens)
    measured = measure(
        shapes,
        hidden=hidden,
        heads=heads,
        device="cuda",
        dtype="bf16",
        repeats=repeats,
        warmups=2,
        progress=lambda line: print(f"block {line}", flush=True),
    )
    fit = fit_cost(measured.timings)
    for line in fit_table(fit):
        print(line, flush=True)
    rows = [
        {
            "length": t.shape.length,
            "samples": t.shape.samples,
            "ms": t.median_ms,
            "ms_per_sample": t.median_ms / t.shape.samples,
        }
        for t in measured.timings
    ]
    return {
        "hidden": hidden,
        "heads": heads,
        "attention": measured.attention,
        "tokens_per_micro_batch": tokens,
        "rows": rows,
        "fit_ms": {
            "alpha": fit.alpha,
            "beta": fit.beta,
            "gamma": fit.gamma,
            "per_micro_batch": fit.per_micro_batch,
            "beta_over_alpha": fit.beta / fit.alpha if fit.alpha > 0 else None,
        },
        "fit_r_squared": fit.r_squared(),
        "fit_worst_relative_error": float(max(fit.worst_error_by_length().values())),
    }


# -- 3. planned steps on real blocks ----------------------------------------------------------------------


def _predicted_ms(fit: dict[str, float], lengths: list[int]) -> float:
    """The cost model's time of one micro-batch: the fit per sample, summed."""
    as_float = [float(n) for n in lengths]
    return sum(fit["alpha"] * n * n + fit["beta"] * n + fit["constant"] for n in as_float)


def _variant(method: str, pad_to_multiple_of: int) -> str:
    return method if pad_to_multiple_of == 1 else f"{method}+pad{pad_to_multiple_of}"


def planned_steps(
    plans: dict[str, Any],
    methods: list[str],
    budget_s: float,
    out: dict[str, Any],
    save: Any,
    device_name: str = "cuda",
    shape: tuple[int, int] = (4096, 32),
    pad_multiples: tuple[int, ...] = (1,),
) -> None:
    """Times every micro-batch of the exported plans, steps interleaved across methods so that a spent
    ``budget_s`` (per context) leaves every method with the same steps; fills ``out[context]`` and calls
    ``save()`` after each context. ``shape`` is the block's hidden size and heads. Each entry of
    ``pad_multiples`` other than 1 adds a variant ``<method>+pad<m>`` of every method, timed in the same
    step as the sink hands micro-batches over with ``pad_to_multiple_of=m``: one padding sample up to a
    multiple of m tokens (the prediction and the fill count the samples alone)."""
    import numpy as np
    import torch

    from pipeline.tools.calibrate.block import Block, attention_backend
    from pipeline.tools.calibrate.timing import DTYPES, time_micro_batch

    device = torch.device(device_name)
    dtype = DTYPES["bf16" if device.type == "cuda" else "fp32"]
    torch.manual_seed(0)
    block = Block(*shape, attention_backend(device, dtype)).to(device, dtype)
    fit = plans["fit_ms"]
    ranks = plans["ranks"]

    first = next(iter(plans["contexts"].values()))["methods"][methods[0]]["plans"][0]
    for _ in range(2):  # warm-up: kernels, allocator
        for micro_batch in first[0]:
            if micro_batch:
                time_micro_batch(block, micro_batch, device, dtype)
    for context, entry in plans["contexts"].items():
        began = time.perf_counter()
        capacity = entry["micro_batches"] * entry["capacity"] * ranks
        variants = {_variant(m, pad): (m, pad) for m in methods for pad in pad_multiples}
        timed: dict[str, dict[str, list]] = {
            v: {"measured": [], "predicted": [], "tokens": [], "errors": []} for v in variants
        }
        steps = min(len(entry["methods"][m]["plans"]) for m in methods)
        for step in range(steps):
            if time.perf_counter() - began > budget_s:
                break
            for variant, (method, pad_to_multiple_of) in variants.items():
                measured, predicted = [], []
                for rank in entry["methods"][method]["plans"][step]:
                    rank_ms, rank_predicted = 0.0, 0.0
                    for micro_batch in rank:
                        if not micro_batch:
                            continue
                        pad = -sum(micro_batch) % pad_to_multiple_of
                        ms = time_micro_batch(block, [*micro_batch, pad] if pad else micro_batch, device, dtype)
                        guess = _predicted_ms(fit, micro_batch)
                        timed[variant]["errors"].append(guess / ms - 1)
                        rank_ms, rank_predicted = rank_ms + ms, rank_predicted + guess
                    measured.append(rank_ms)
                    predicted.append(rank_predicted)
                timed[variant]["measured"].append(measured)
                timed[variant]["predicted"].append(predicted)
                timed[variant]["tokens"].append(
                    sum(sum(mb) for rank in entry["methods"][method]["plans"][step] for mb in rank)
                )
        summary = {}
        for variant, t in timed.items():
            if not t["measured"]:
                continue
            row = {"steps": len(t["measured"]), "fill": sum(t["tokens"]) / (capacity * len(t["tokens"]))}
            for kind in ("measured", "predicted"):
                per_step = [np.asarray(r) for r in t[kind]]
                row[f"{kind}_tokens_per_s"] = sum(t["tokens"]) / sum(float(r.max()) for r in per_step) * 1e3
                row[f"{kind}_max_over_mean"] = statistics.median(float(r.max() / r.mean()) for r in per_step)
            errors = np.abs(np.asarray(t["errors"]))
            row["model_error_median"] = float(np.median(errors))
            row["model_error_p95"] = float(np.quantile(errors, 0.95))
            method = variants[variant][0]
            row["simulated_tokens_per_s_100_steps"] = entry["methods"][method]["simulated_tokens_per_s"]
            summary[variant] = row
        for variant, row in summary.items():
            naive = summary.get(_variant("naive", variants[variant][1]))
            if naive is not None:
                for kind in ("measured", "predicted"):
                    row[f"{kind}_vs_naive"] = row[f"{kind}_tokens_per_s"] / naive[f"{kind}_tokens_per_s"]
        out[context] = {"seconds": time.perf_counter() - began, "methods": summary, "raw": timed}
        save()
        for variant, row in summary.items():
            versus = {
                k: f" ({row[f'{k}_vs_naive']:.2f}x)" if f"{k}_vs_naive" in row else ""
                for k in ("measured", "predicted")
            }
            print(
                f"plans {context} {variant:15s} steps {row['steps']} "
                f"measured {row['measured_tokens_per_s'] / 1e6:.3f} Mtok/s{versus['measured']} "
                f"max/mean {row['measured_max_over_mean']:.3f} | predicted {row['predicted_tokens_per_s'] / 1e6:.3f}"
                f"{versus['predicted']} max/mean {row['predicted_max_over_mean']:.3f} | "
                f"fill {row['fill']:.3f} | model error per micro-batch median {row['model_error_median']:.1%} "
                f"p95 {row['model_error_p95']:.1%}",
                flush=True,
            )


def repeated_micro_batches(
    plans: dict[str, Any],
    per_context: int,
    repeats: int,
    contexts: list[str] | None = None,
    multiples: tuple[int, ...] = (2048,),
) -> dict[str, Any]:
    """Whether a micro-batch's time depends on what ran before it, and on its token count being round:
    ``per_context`` composed micro-batches of each context, each timed ``repeats`` times in a row and once
    more per entry of ``multiples`` with its tokens padded to that multiple (a padding sample), against the
    cost model's prediction."""
    import numpy as np
    import torch

    from pipeline.tools.calibrate.block import Block, attention_backend
    from pipeline.tools.calibrate.timing import time_micro_batch

    device, dtype = torch.device("cuda"), torch.bfloat16
    block = Block(4096, 32, attention_backend(device, dtype)).to(device, dtype)
    fit = plans["fit_ms"]
    rows = []
    for context, entry in plans["contexts"].items():
        if contexts and context not in contexts:
            continue
        chosen = [mb for step in entry["methods"]["composed"]["plans"] for rank in step for mb in rank if mb]
        for micro_batch in chosen[:: max(1, len(chosen) // per_context)][:per_context]:
            lengths = np.asarray(micro_batch, dtype=np.float64)
            predicted = _predicted_ms(fit, micro_batch)
            times = [time_micro_batch(block, micro_batch, device, dtype) for _ in range(repeats)]
            padded = {}
            for multiple in multiples:
                pad = -int(lengths.sum()) % multiple
                padded[str(multiple)] = time_micro_batch(
                    block, [*micro_batch, pad] if pad else micro_batch, device, dtype
                )
            rows.append(
                {
                    "context": context,
                    "samples": len(micro_batch),
                    "tokens": int(lengths.sum()),
                    "predicted_ms": predicted,
                    "ms": times,
                    "padded_ms": padded,
                }
            )
            print("repeat", json.dumps(rows[-1]), flush=True)
    summary = {}
    for k in range(repeats):
        summary[f"repeat_{k}_error_median"] = float(np.median([r["predicted_ms"] / r["ms"][k] - 1 for r in rows]))
    for multiple in multiples:
        errors = [r["predicted_ms"] / r["padded_ms"][str(multiple)] - 1 for r in rows]
        summary[f"padded_{multiple}_error_median"] = float(np.median(errors))
    print("repeats", json.dumps(summary), flush=True)
    return {"summary": summary, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="record a rank topic (here, with a broker)")
    parser.add_argument("--job")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--messages", type=Path, help="the recorded rank topic to replay")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--block-lengths", default="256,512,1024,2048,4096,8192,16384,32768,65536")
    parser.add_argument("--block-tokens", type=int, default=65536)
    parser.add_argument("--skip-block", action="store_true")
    parser.add_argument("--skip-sink", action="store_true")
    parser.add_argument("--plans", type=Path, help="balance_sim_bench.py --export-plans output to time")
    parser.add_argument("--methods", default="naive,composed")
    parser.add_argument("--plans-budget-s", type=float, default=100.0, help="per context")
    parser.add_argument(
        "--pad-to-multiples",
        default="1",
        help="comma-separated: time every method's micro-batches also padded as the sink pads them (1: not padded)",
    )
    parser.add_argument("--repeat-probe", type=int, default=0, help="micro-batches per context to time repeatedly")
    parser.add_argument("--probe-contexts", default="64k,32k")
    parser.add_argument("--probe-multiples", default="8,64,2048", help="token multiples the probe pads to")
    args = parser.parse_args()
    if args.record:
        record(args.job, args.rank, args.bootstrap_servers, args.out)
        return 0
    import torch

    name = torch.cuda.get_device_name()
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    result: dict[str, Any] = {"device": name, "torch": torch.__version__}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=1))

    parts: dict[str, Any] = {}
    if args.plans is not None:
        plans = json.loads(args.plans.read_text())
        planned = {"mix": plans["mix"], "ranks": plans["ranks"], "fit_ms": plans["fit_ms"], "contexts": {}}
        result["plans"] = planned
        if args.repeat_probe:
            parts["repeats"] = lambda: repeated_micro_batches(
                plans,
                args.repeat_probe,
                repeats=3,
                contexts=args.probe_contexts.split(","),
                multiples=tuple(int(m) for m in args.probe_multiples.split(",")),
            )
        else:
            parts["plans"] = lambda: planned_steps(
                plans,
                args.methods.split(","),
                args.plans_budget_s,
                planned["contexts"],
                save,
                pad_multiples=tuple(int(m) for m in args.pad_to_multiples.split(",")),
            )
    if not args.skip_sink:
        rows = pickle.loads(args.messages.read_bytes())
        parts["sink"] = lambda: sink_under_training(rows, args.rank, args.steps, args.repeats)
    if not args.skip_block:
        lengths = [int(x) for x in args.block_lengths.split(",")]
        parts["block"] = lambda: block_timings(lengths, args.block_tokens, repeats=5)
    failed = False
    for part, run in parts.items():
        try:
            value = run()
            if value is not None:
                result[part] = value
                print(part, json.dumps(value, indent=1), flush=True)
        except Exception:  # one part failing must not lose the other's numbers
            failed = True
            result[part] = {"error": traceback.format_exc()}
            print(part, result[part]["error"], flush=True)
        save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
