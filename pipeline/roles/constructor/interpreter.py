"""The constructor process's interpreter settings: its garbage collector and its thread switching.

**Garbage collection.** A full collection walks every tracked object alive: after start-up, hundreds of
thousands of them belong to the imported libraries (numba's type system and compiled kernels above all),
and each step allocates thousands of samples that outlive the young generations, so full collections came
every step or two and cost the main thread up to a tenth of a second each time. Once start-up has loaded
the scheduler's kernels, everything alive is moved to the collector's permanent generation
(``gc.freeze``): full collections then walk only what the constructor created since. Frozen objects are
still freed by reference counting; only cyclic garbage among them would stay, and the collection just
before the freeze leaves none.

**Thread switching.** The writer thread runs each step's transaction while the main thread, in Python,
prepares the next step. Every time a Kafka call of the writer returns (begin, send the offsets, commit,
each a wait on the broker), the writer needs the interpreter lock back, and waits up to the switch
interval for the main thread to hand it over: 5 ms by default, several times a transaction, all of it on
the transaction's critical path. ``SWITCH_INTERVAL_S`` shortens that wait."""

from __future__ import annotations

import gc
import sys

SWITCH_INTERVAL_S = 0.0005

_frozen = False


def hand_over_sooner() -> None:
    """Let a thread waiting for the interpreter lock (the writer, back from the broker) have it within
    ``SWITCH_INTERVAL_S``; a shorter interval already set is kept."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


def freeze_start_up() -> None:
    """Collect, then freeze what is alive; once per process (later calls do nothing)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
