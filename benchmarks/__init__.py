"""The benchmarks, run from the repository root as `python -m benchmarks.NAME` with mixflow installed."""
