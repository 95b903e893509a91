"""Step composition's own time: planning options lazily against planning every one, at 8 to 512 ranks.

    .venv/bin/python -m benchmarks.compose_bench [--ranks 8,64,512] [--contexts 8k,64k] [--steps N] [--markdown]

The 70/25/5 stream of ``balance_sim_bench.py`` (seed 0), composed steps as the constructor makes them
(``compose_step`` then ``plan_step``, deferred samples first). Each row runs the same steps twice:
**every option**, where each of the up to 25 options is planned with ``plan_step`` and scored (what
``compose_step`` did before), and **lazy**, ``choose_option`` as shipped, which plans an option only
while it could change the choice. Reported: median ms per ``compose_step`` call of each, their ratio,
options planned per step, and whether both made the same steps (tokens/s and balance of every step equal).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable

import numpy as np

from benchmarks import balance_sim_bench as sim
from benchmarks._table import add_markdown_flag, print_table
from pipeline.planning.mixing._composition import options


def every_option(
    count: int,
    upper_of: Callable[[int], float],
    score_of: Callable[[int], float],
    prefer_older: float,
    bound: float = math.inf,
) -> int:
    """The choice made by building and scoring every option (the reference the lazy choice must equal)."""
    scores = [score_of(i) for i in range(count)]
    best = max(scores)
    return next(i for i, value in enumerate(scores) if value >= best - prefer_older)


def run(ranks: int, context: str, steps: int, warm_up: int, lazy: bool) -> tuple[sim.Result, float]:
    """The run's result and the options planned per step."""
    sim.RANKS = ranks
    micro_batches, capacity = sim.SHAPES[context]
    tokens = int(((steps + warm_up) * 1.3 + 3 * (sim.DEFAULT_WINDOW + 3)) * ranks * micro_batches * capacity)
    stream = sim.make_stream(sim.MIXES[0], capacity, tokens, np.random.default_rng([0, capacity]))
    planned = [0]
    score = options.score

    def counted(*args: object) -> float:
        planned[0] += 1
        return score(*args)  # type: ignore[arg-type]

    chosen = options.choose_option
    options.score = counted  # type: ignore[assignment]
    if not lazy:
        options.choose_option = every_option
    try:
        result = sim.mixflow(stream, micro_batches, capacity, steps, warm_up, composed=True)
    finally:
        options.score = score
        options.choose_option = chosen
    return result, planned[0] / (steps + warm_up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,64,512")
    parser.add_argument("--contexts", default="8k,64k")
    parser.add_argument("--steps", type=int, default=12, help="steps timed after the warm-up")
    parser.add_argument("--warm-up", type=int, default=4)
    add_markdown_flag(parser)
    args = parser.parse_args()
    sim.plan_step(np.arange(1, 100, dtype=np.int64), 4, 2, 1000)  # compile (or load) the kernels first
    rows = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for context in args.contexts.split(","):
            every, every_planned = run(ranks, context, args.steps, args.warm_up, lazy=False)
            lazy, lazy_planned = run(ranks, context, args.steps, args.warm_up, lazy=True)
            same = every.ratios == lazy.ratios and every.tokens == lazy.tokens and math.isclose(every.ms, lazy.ms)
            every_ms = statistics.median(every.draw_times) * 1e3
            lazy_ms = statistics.median(lazy.draw_times) * 1e3
            rows.append(
                [
                    ranks,
                    context,
                    f"{every_ms:.1f}",
                    f"{lazy_ms:.1f}",
                    f"{every_ms / lazy_ms:.1f}x",
                    f"{every_planned:.1f}",
                    f"{lazy_planned:.1f}",
                    "yes" if same else "NO",
                ]
            )
    headers = ["R", "context", "every option ms", "lazy ms", "speed-up", "planned/step every", "planned/step lazy"]
    print_table([*headers, "same steps"], rows, markdown=args.markdown)
    print(f"median over {args.steps} steps after {args.warm_up} of warm-up, one process, seed 0")


if __name__ == "__main__":
    main()
