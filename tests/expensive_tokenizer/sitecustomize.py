"""Test-only: a tokenizer that costs N times as much per token, for the autoscaling tests and benchmark.

Python imports this module at start-up in processes whose ``PYTHONPATH`` holds this folder (only the
processes of a job that ``tests/autoscale_support.py`` or ``benchmarks/autoscale_bench.py`` start). A
tokenizer file whose name ends in ``.costly<N>.json`` then encodes every batch N times and returns the
last encoding: the same tokens, N times the tokenizing work. One named ``*.wait<U>.json`` encodes once and
then sleeps U microseconds per token: time without CPU, as a loader that waits on something (or has a
machine of its own) would spend it. Users never have this folder on their path.

With ``$MIXFLOW_CPU_LOG`` set to a folder, each process also writes its command line and CPU seconds
there when it exits (``<pid>.json``), for the benchmark's loader CPU-seconds per token.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import time

try:
    from connectors.tokenizer import TextTokenizer
except ImportError:  # not a mixflow environment: nothing to slow down
    TextTokenizer = None  # type: ignore[assignment, misc]

COSTLY = re.compile(r"\.costly(\d+)\.json$")
WAIT = re.compile(r"\.wait(\d+)\.json$")

if TextTokenizer is not None:
    _encode_batch = TextTokenizer.encode_batch

    def _costly_encode_batch(self: TextTokenizer, texts):  # type: ignore[no-untyped-def]
        found = COSTLY.search(self.name)
        for _ in range(int(found.group(1)) - 1 if found else 0):
            _encode_batch(self, texts)
        encoded = _encode_batch(self, texts)
        if wait := WAIT.search(self.name):
            time.sleep(int(wait.group(1)) * 1e-6 * sum(len(ids) for ids in encoded))
        return encoded

    TextTokenizer.encode_batch = _costly_encode_batch  # type: ignore[method-assign]


def _write_cpu_seconds(folder: str) -> None:
    times = os.times()
    record = {"argv": sys.argv, "cpu_seconds": times.user + times.system}
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
        json.dump(record, out)


if cpu_log := os.environ.get("MIXFLOW_CPU_LOG"):
    atexit.register(_write_cpu_seconds, cpu_log)
