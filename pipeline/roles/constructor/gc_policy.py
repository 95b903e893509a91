"""The constructor's use of Python's cyclic garbage collector.

A full collection walks every tracked object alive: after start-up, hundreds of thousands of them belong to
the imported libraries (numba's type system and compiled kernels above all), and each step allocates
thousands of samples that outlive the young generations, so full collections came every step or two and
cost the main thread up to a tenth of a second each time. Once start-up has loaded the scheduler's
kernels, everything alive is moved to the collector's permanent generation (``gc.freeze``): full
collections then walk only what the constructor created since. Frozen objects are still freed by reference
counting; only cyclic garbage among them would stay, and the collection just before the freeze leaves none.

The youngest generation is collected every ``YOUNG_THRESHOLD`` allocations instead of 700: a step
allocates a few objects per sample, and most of them live until the step is written, so frequent young
collections only moved them along."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000

_frozen = False


def freeze_start_up() -> None:
    """Collect, then freeze what is alive, and collect the youngest generation less often; once per process
    (later calls do nothing)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
