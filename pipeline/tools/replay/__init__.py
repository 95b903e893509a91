"""Replay a job's steps into another job: the determinism audit, and elastic world size.

Under the original's step shape the constructor mixes again from the state of the first step replayed,
and must write the same bytes (``audit``). Under another number of ranks each step's samples are read
back from the original's rank topics (a context-parallel job's put back together from their slices) and
planned again over the new shape, with the original's state
record, so that ``mixflow construct`` can go on with the replayed job under the new shape. Either way a
replay is one transaction per step and continues where an earlier run of it stopped.
"""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
