"""What the planning kernels share: the ``kernel`` decorator (numba, cached on disk, never stale) and the
trees over ranks that both planners search (``trees``)."""
