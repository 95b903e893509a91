"""Measuring the cost model on the training device (``mixflow calibrate``).

One transformer block is timed forward and backward over packed micro-batches of several sample
lengths (``timing``, ``block``: torch, imported only there), and ``alpha``, ``beta`` and ``gamma`` of
``alpha*L^2 + beta*L + gamma`` are fitted to the times (``fit``: numpy alone), then written as the
spec's ``cost:`` section (``section``). With ``--vision`` the vision encoder's block (full attention within
each image or clip, items of ``n`` patches packed over ``cu_seqlens``) is timed and fitted the same way, per
item, in the same unit, and written as that section's ``vision:`` part.
"""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
