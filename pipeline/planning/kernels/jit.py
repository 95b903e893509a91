"""``kernel``: numba's ``njit`` with an on-disk cache that is fresh only while every planning module is.

numba's own cache (``cache=True``) checks only the file of the function it caches, but a compiled kernel
holds the code of every jitted function it calls and every global it reads, from whatever module: after
an edit of a callee in another module it would load the old code. Here the cache's source stamp is
numba's (the function's file) together with a digest of every ``.py`` file under ``pipeline/planning``,
where every kernel and everything a kernel reads lives (``tests/test_kernel_cache.py`` holds both). An
edit anywhere in planning thus compiles every kernel once more; a checkout that does not change loads
them. The cache lives where numba puts it (``__pycache__``, or ``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba import njit
from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator

PLANNING = Path(__file__).resolve().parent.parent


@functools.cache
def planning_digest() -> str:
    """sha256 over the relative path and bytes of every ``.py`` file under ``pipeline/planning``."""
    digest = hashlib.sha256()
    for path in sorted(PLANNING.rglob("*.py")):
        digest.update(path.relative_to(PLANNING).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


class _PlanningLocator(_CacheLocator):
    """numba's locator for the function, with the planning digest added to its source stamp."""

    def __init__(self, inner: _CacheLocator) -> None:
        self._inner = inner

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return self._inner.get_cache_path()

    def get_source_stamp(self) -> tuple[object, str]:
        return self._inner.get_source_stamp(), planning_digest()

    def get_disambiguator(self) -> str:
        return self._inner.get_disambiguator()


class _PlanningCacheImpl(CompileResultCacheImpl):
    def __init__(self, py_func: Callable[..., Any]) -> None:
        super().__init__(py_func)
        self._locator = _PlanningLocator(self._locator)


class _PlanningCache(FunctionCache):
    _impl_class = _PlanningCacheImpl


def kernel(function: Callable[..., Any] | None = None, *, inline: str = "never") -> Any:
    """``njit`` (nopython, releasing the GIL: a kernel touches only its arrays, so plans can run on several
    threads) with the cache above; ``@kernel`` or ``@kernel(inline="always")``."""

    def compile_lazily(py_func: Callable[..., Any]) -> Any:
        dispatcher = njit(inline=inline, nogil=True)(py_func)
        dispatcher._cache = _PlanningCache(py_func)  # what enable_caching() does, with this cache class
        return dispatcher

    return compile_lazily(function) if function is not None else compile_lazily
