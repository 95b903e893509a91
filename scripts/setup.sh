#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: a virtual environment at .venv with mixflow and its
# development extra installed, and torch only when it is not importable already.
# Source it (`. scripts/setup.sh`) or run it; it changes nothing when everything is in place.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python="${MIXFLOW_PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      python="$candidate"
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "setup: needs Python 3.11 or newer on PATH (or MIXFLOW_PYTHON)" >&2
  exit 1
fi

# --system-site-packages lets a torch that the machine already has serve the venv as well.
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version)"
  "$python" -m venv --system-site-packages .venv
fi

stamp=.venv/.mixflow-install-stamp
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing mixflow[dev] into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
  echo "$want" > "$stamp"
fi

# torch from PyPI is a CUDA build of a few GB. It is installed once per machine into a shared folder
# (not into each clone's .venv) and linked into the venv with a .pth file; a torch the machine already
# has (system or user site-packages) is used as it is.
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
  cache="${MIXFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixflow}"
  tag="$(.venv/bin/python -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
  target="$cache/torch-$tag"
  if [ ! -f "$target/.complete" ]; then
    echo "setup: torch is not importable; installing it once into $target (a download of a few GB)"
    rm -rf "$target.partial"
    .venv/bin/python -m pip install -q --disable-pip-version-check --target "$target.partial" torch
    rm -rf "$target"
    mv "$target.partial" "$target"
    touch "$target/.complete"
  fi
  site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$target" > "$site/mixflow-shared-torch.pth"
  .venv/bin/python -c 'import torch' || { echo "setup: torch still does not import" >&2; exit 1; }
fi

# The trainer integrations' frameworks (their tests; tests/test_layout.py imports every module), installed
# once torch is importable, so that pip takes that torch for theirs instead of downloading another.
# torchtitan is left out: resolved together with the others in a fresh venv, pip backtracks for many
# minutes; `pip install "mixflow[torchtitan]"` on its own is quick, and its tests skip without it.
if ! .venv/bin/python -c 'import accelerate, lightning' >/dev/null 2>&1; then
  echo "setup: installing mixflow[huggingface,lightning] into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[huggingface,lightning]'
fi

for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup: '$tool' is not on PATH; the local Kafka broker needs Java 17+ and Maven" >&2
    exit 1
  fi
done

# The local S3-compatible object store (Versity S3 Gateway) for `stack up --object-store` and the object-store
# tests: built once with `go install` into the shared cache (about a minute); nothing to do when cached.
if ! .venv/bin/python -c 'from pipeline.tools.stack.object_store_install import ensure_installed; ensure_installed()'; then
  echo "setup: could not build the local object store (versitygw); it needs Go 1.24+ on PATH once" >&2
  exit 1
fi
