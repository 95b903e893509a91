"""Build the local object store's server, Versity S3 Gateway (``versitygw``, Apache-2.0), once into a cache.

It is a Go module: ``go install github.com/versity/versitygw/cmd/versitygw@<version>`` through the Go module
proxy, into ``<cache>/bin/versitygw-<version>`` (the cache of ``pipeline/tools/stack/jars.py``, shared by
every checkout on the machine). ``$MIXFLOW_VERSITYGW`` names a binary to use instead (a container image's).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline.tools.stack.jars import default_cache_dir
from topics.errors import MixflowError

log = logging.getLogger(__name__)

VERSITYGW_MODULE = "github.com/versity/versitygw/cmd/versitygw"
VERSITYGW_VERSION = "v1.8.0"
BINARY_ENV = "MIXFLOW_VERSITYGW"


def installed_path(cache_dir: Path | None = None, version: str = VERSITYGW_VERSION) -> Path:
    """Where the build of ``version`` lives in the cache (it may not be there yet)."""
    return (cache_dir or default_cache_dir()) / "bin" / f"versitygw-{version}"


def ensure_installed(cache_dir: Path | None = None, version: str = VERSITYGW_VERSION) -> Path:
    """The ``versitygw`` binary: ``$MIXFLOW_VERSITYGW`` when set, else the cached build of ``version``,
    built with ``go install`` first when the cache lacks it (about a minute). The build goes to a
    temporary folder and is renamed into place, so an interrupted build leaves no half binary."""
    if env := os.environ.get(BINARY_ENV):
        binary = Path(env)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            msg = f"${BINARY_ENV} names {binary}, which is not an executable file"
            raise MixflowError(msg)
        return binary
    target = installed_path(cache_dir, version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        msg = (
            f"'go' is not on PATH; it is needed once to build the local object store (versitygw {version}) "
            f"into {target}. Install Go 1.24 or newer, or set ${BINARY_ENV} to a versitygw binary"
        )
        raise MixflowError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("building versitygw %s with `go install` into %s (about a minute, once)", version, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        env = {**os.environ, "GOBIN": tmp, "CGO_ENABLED": "0"}
        command = [go, "install", "-trimpath", f"{VERSITYGW_MODULE}@{version}"]
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        built = Path(tmp) / "versitygw"
        if result.returncode != 0 or not built.is_file():
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
            msg = f"`go install {VERSITYGW_MODULE}@{version}` failed (exit {result.returncode}):\n{tail}"
            raise MixflowError(msg)
        built.rename(target)
    return target
