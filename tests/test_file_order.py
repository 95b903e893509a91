"""The suite hands its longest files out first: files in order of their recorded seconds, a file not recorded as
the median one, each file's tests in their own order."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from tests.file_order import longest_first


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=30),
    st.dictionaries(st.integers(0, 6).map(lambda f: f"test_{f}.py"), st.integers(0, 500), max_size=6),
)
def test_files_go_longest_first_and_keep_their_tests_in_order(
    tests: list[tuple[int, int]], seconds: dict[str, int]
) -> None:
    items = [SimpleNamespace(nodeid=f"tests/test_{f}.py::t{i}_{n}") for i, (f, n) in enumerate(tests)]
    ordered = longest_first(items, {k: float(v) for k, v in seconds.items()})  # type: ignore[arg-type]
    assert sorted(map(id, ordered)) == sorted(map(id, items))
    files = [item.nodeid.split("::")[0].removeprefix("tests/") for item in ordered]
    runs = list(dict.fromkeys(files))
    assert files == sorted(files, key=runs.index), "a file's tests stay together"
    typical = statistics.median(seconds.values()) if seconds else 0.0
    weights = [seconds.get(name, typical) for name in runs]
    assert weights == sorted(weights, reverse=True), "longest first; a file not recorded as the median one"
    for name in runs:
        of_file = [item.nodeid for item in items if item.nodeid.startswith(f"tests/{name}::")]
        assert [item.nodeid for item in ordered if item.nodeid.startswith(f"tests/{name}::")] == of_file
