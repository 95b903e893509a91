"""Step composition's parts: which window samples make up a step so that it can be balanced.

``pipeline.planning.mixing.compose`` is the entry (``compose_step``: the windows, the waiting bound, the
shares); it hands the windows to ``options.compose_takes``. Each module imports only those listed above it:

- ``values``: the values composition passes around (a source's window, long samples, what the hole
  packing needs, what a grouping or packing built, the answer, a step's media).
- ``windows``: the windows read by position: the candidates, what an option takes from one source
  (``Fill``), where each of the step's samples lies (``Homes``).
- ``kernel_arrays``: the values as the numba kernels take them, and the helpers both kernels use.
- ``packing``: the kernels that pack a step with window samples where short samples are too few: the holes
  of a grouping (``fill_holes``), or whole micro-batches best fit (``pack_bins``).
- ``groups``: the kernel that builds one group of long samples per rank up to a level of excess
  (``build_groups``), and packs its holes where asked.
- ``options``: the step's options, built, scored as the scheduler will plan them, and chosen lazily.

Words used throughout:

- *window*: per source, the head of its FIFO holding a few steps of its tokens (its *unit*: tokens per
  step at its weight); *remaining*: the tokens it is to give this step beyond its deferred samples.
- *due*: a window sample with fewer than ``due * unit`` tokens before it (and below *remaining*): every
  option takes it. *allowance*: a source's remaining tokens beyond its due samples.
- *long*: costing at least ``options.LONG_FRACTION`` of a full rank; the rest are *short*.
- *excess*: a sample's cost over what its tokens cost at the short samples' cost per token (``rho``).
- *seeds*: the long samples deferred or due; *first*: the other samples every option holds (short
  deferred or due ones, what sources without a window give); *candidates*: window samples not due.
- *option*: a level of excess per rank and an *anchor* (a candidate held first, -1 for none): grouped
  (groups up to the level, short samples filling each source to its target), or *packed*.
- *hole*: what a micro-batch lacks of its capacity; *slot*: the micro-batch ``rank * micro_batches + m``
  a sample went into, -1 for none; *placement*: a packed option's slots, which the scheduler starts from.
"""
