"""Build the example data set: three sources from the running interpreter's standard library, and a
small byte-level BPE tokenizer trained on them.

    python examples/build_example_data.py --out examples/data

- ``code/``: Parquet files of the stdlib's ``.py`` modules (columns ``path``, ``text``), sorted by path,
  64 rows per row group;
- ``docstrings/``: JSONL files of module, class and function docstrings (``path``, ``qualname``, ``text``);
- ``topics/``: one plain text file per ``pydoc_data.topics`` topic;
- ``tokenizer.json``: byte-level BPE with ``<|endoftext|>`` as token 0.

The data comes from whichever Python runs this script, so files, row counts and ids differ between
Python versions (even patch releases); for one interpreter the build is deterministic. Each output is
written to a temporary folder and renamed into place, then stamped with a hash of its inputs; a later
run skips outputs whose stamp still matches.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

BUILD_VERSION = 1
ROWS_PER_ROW_GROUP = 64
ROWS_PER_CODE_FILE = 3 * ROWS_PER_ROW_GROUP
ROWS_PER_DOCSTRING_FILE = 4000
EOD_TOKEN = "<|endoftext|>"
TRAIN_BYTES_PER_SOURCE = 1 << 20
TRAIN_BYTES_PER_TEXT = 16 << 10
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})

Module = tuple[str, str]  # (path relative to the stdlib root, source text)


def stdlib_files(root: Path, limit: int | None) -> list[Path]:
    """The stdlib's ``.py`` files outside test suites and site-packages, sorted by relative path;
    with ``limit``, that many spread evenly over the list."""
    files = sorted(
        (p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    files = [p for p in files if not p.name.startswith("test_") and p.is_file()]
    if limit is not None and limit < len(files):
        files = [files[i * len(files) // limit] for i in range(limit)]
    return files


def read_modules(root: Path, files: list[Path]) -> list[Module]:
    modules = []
    for path in files:
        try:
            modules.append((path.relative_to(root).as_posix(), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return modules


def docstrings(modules: list[Module]) -> Iterator[dict[str, str]]:
    """Docstrings in source order; the module's own has qualname ``<module>``."""
    for path, text in modules:
        try:
            tree = ast.parse(text, filename=path)
        except (SyntaxError, ValueError):
            continue
        yield from _node_docstrings(path, tree, "")


def _node_docstrings(path: str, node: ast.AST, prefix: str) -> Iterator[dict[str, str]]:
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(node)
        if doc:
            yield {"path": path, "qualname": prefix or "<module>", "text": doc}
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _node_docstrings(path, child, f"{prefix}.{child.name}" if prefix else child.name)


def write_code(modules: list[Module], folder: Path) -> None:
    for part, first in enumerate(range(0, len(modules), ROWS_PER_CODE_FILE)):
        rows = modules[first : first + ROWS_PER_CODE_FILE]
        table = pa.table({"path": [p for p, _ in rows], "text": [t for _, t in rows]})
        pq.write_table(table, folder / f"part-{part:05d}.parquet", row_group_size=ROWS_PER_ROW_GROUP)


def write_docstrings(records: list[dict[str, str]], folder: Path) -> None:
    for part, first in enumerate(range(0, len(records), ROWS_PER_DOCSTRING_FILE)):
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records[first : first + ROWS_PER_DOCSTRING_FILE])
        (folder / f"part-{part:05d}.jsonl").write_text("".join(lines), encoding="utf-8")


def write_topics(topics: dict[str, str], folder: Path) -> None:
    for key in sorted(topics):
        (folder / f"{key}.txt").write_text(topics[key], encoding="utf-8")


def training_texts(modules: list[Module], records: list[dict[str, str]], topics: dict[str, str]) -> list[str]:
    """A fixed subset of each source, capped in bytes, so training stays fast and deterministic."""
    texts: list[str] = []
    for source in (
        [t for _, t in modules],
        [r["text"] for r in records],
        [topics[k] for k in sorted(topics)],
    ):
        taken = 0
        step = max(1, sum(map(len, source)) // TRAIN_BYTES_PER_SOURCE)
        for text in source[::step]:
            texts.append(text[:TRAIN_BYTES_PER_TEXT])
            taken += len(texts[-1])
            if taken >= TRAIN_BYTES_PER_SOURCE:
                break
    return texts


def train_tokenizer(texts: list[str], vocab_size: int, path: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD_TOKEN], show_progress=False
    )
    tokenizer.save(str(path))


def fingerprint(*parts: object) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def build_once(out: Path, name: str, inputs_hash: str, write: Callable[[Path], None]) -> bool:
    """Write output ``name`` (a file or folder under ``out``) unless its stamp says it is complete and
    current. Returns whether it was built."""
    target, stamp = out / name, out / f".{name}.stamp"
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        if recorded["hash"] == inputs_hash and all((out / f).is_file() for f in recorded["files"]):
            return False
    stamp.unlink(missing_ok=True)
    scratch = out / f".{name}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    write(scratch)
    if target.is_dir():
        shutil.rmtree(target)
    produced = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())
    if name.endswith(".json"):
        (scratch / name).replace(target)
        scratch.rmdir()
        files = [name]
    else:
        scratch.replace(target)
        files = [f"{name}/{f}" for f in produced]
    stamp.write_text(json.dumps({"hash": inputs_hash, "files": files}, indent=1))
    return True


def build(out: Path, *, limit: int | None = None, vocab_size: int = 8192) -> dict[str, bool]:
    """Build every output under ``out``; returns, per output, whether it was (re)built."""
    from pydoc_data.topics import topics as all_topics

    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root, limit)
    base = (BUILD_VERSION, sys.version, limit)
    module_hash = fingerprint(
        *base, [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    )
    topic_keys = sorted(all_topics)[:limit] if limit is not None else sorted(all_topics)
    topics = {k: all_topics[k] for k in topic_keys}
    topics_hash = fingerprint(*base, hashlib.blake2b(json.dumps(topics, sort_keys=True).encode()).hexdigest())
    tokenizer_hash = fingerprint(module_hash, topics_hash, vocab_size, TRAIN_BYTES_PER_SOURCE, TRAIN_BYTES_PER_TEXT)

    out.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, list] = {}

    def modules() -> list[Module]:
        if "modules" not in loaded:
            loaded["modules"] = read_modules(root, files)
        return loaded["modules"]

    def records() -> list[dict[str, str]]:
        if "records" not in loaded:
            loaded["records"] = list(docstrings(modules()))
        return loaded["records"]

    return {
        "code": build_once(out, "code", module_hash, lambda d: write_code(modules(), d)),
        "docstrings": build_once(out, "docstrings", module_hash, lambda d: write_docstrings(records(), d)),
        "topics": build_once(out, "topics", topics_hash, lambda d: write_topics(topics, d)),
        "tokenizer.json": build_once(
            out,
            "tokenizer.json",
            tokenizer_hash,
            lambda d: train_tokenizer(training_texts(modules(), records(), topics), vocab_size, d / "tokenizer.json"),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data", help="output folder")
    parser.add_argument("--limit", type=int, default=None, help="use only this many stdlib modules and topics")
    parser.add_argument("--vocab-size", type=int, default=8192, help="tokenizer vocabulary size")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    began = time.perf_counter()
    built = build(args.out, limit=args.limit, vocab_size=args.vocab_size)
    for name, fresh in built.items():
        print(f"{name:15} {'built' if fresh else 'up to date'}")
    print(f"done in {time.perf_counter() - began:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
