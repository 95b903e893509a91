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
if ! .venv/bin/python -c 'import accelerate, lightning' >/dev/null 2>&1; then
  echo "setup: installing mixflow[huggingface,lightning] into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[huggingface,lightning]'
fi
# torchtitan with its own requirements, resolved beside the others, sends pip backtracking for many minutes in
# a fresh venv. So it is installed without them, after the packages its trainer, checkpointing and models
# import, pinned to the versions tested together (a resolution with nothing left to search). Left out: wandb,
# imported only when its logger is enabled.
if ! .venv/bin/python -c 'import torchtitan.trainer' >/dev/null 2>&1; then
  echo "setup: installing torchtitan 0.3.0 into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check torchdata==0.11.0 tyro==1.0.17 \
    spmd_types==0.2.3 tensorboard==2.21.0 datasets==4.7.0 torch_checkpointing==0.1.1 einops==0.8.2 \
    tokenizers safetensors pillow  # in place already (mixflow, transformers): named, not pinned
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps torchtitan==0.3.0
fi
# Megatron-Core installs as a wheel without CUDA builds; its core needs only torch, numpy and packaging.
if ! .venv/bin/python -c 'import megatron.core' >/dev/null 2>&1; then
  echo "setup: installing mixflow[megatron] into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[megatron]'
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
