"""Resolve the Kafka broker's jars from Maven Central into a cache, once per pom version."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from topics.errors import MixflowError

log = logging.getLogger(__name__)

POM = "pom.xml"
STAMP = ".resolved"


def default_cache_dir() -> Path:
    """``$MIXFLOW_CACHE_DIR`` or ``$XDG_CACHE_HOME/mixflow`` (``~/.cache/mixflow``): shared by every
    checkout on the machine, so a fresh clone does not resolve the broker again."""
    if env := os.environ.get("MIXFLOW_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mixflow"


def pom_text() -> str:
    return resources.files("pipeline.tools.stack").joinpath(POM).read_text()


def resolve_broker_jars(cache_dir: Path | None = None) -> Path:
    """Return a folder holding the broker's classpath, resolving it with Maven when the cache lacks it."""
    return resolve_jars(pom_text(), "kafka-libs", "kafka_2.13-*.jar", "the Kafka broker", cache_dir)


def resolve_jars(text: str, prefix: str, marker: str, what: str, cache_dir: Path | None = None) -> Path:
    """Return ``<cache>/<prefix>-<hash of the pom>``, holding the runtime classpath of the pom ``text``
    (its jars, one of them matching the glob ``marker``), resolving it with Maven when the cache lacks it.

    The folder is named after a hash of the pom, so changing a version resolves anew, and it is filled in
    a temporary folder and renamed, so an interrupted resolution leaves no half cache."""
    cache_dir = cache_dir or default_cache_dir()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    libs = cache_dir / f"{prefix}-{digest}"
    if (libs / STAMP).is_file():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = f"Maven ('mvn') is not on PATH; it is needed once to resolve {what} from Maven Central"
        raise MixflowError(msg)
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("resolving %s and its dependencies with Maven into %s", what, libs)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".resolve-") as tmp:
        pom = Path(tmp) / POM
        pom.write_text(text)
        out = Path(tmp) / "libs"
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(out.glob(marker)):
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
            msg = f"Maven could not resolve {what} (exit {result.returncode}):\n{tail}"
            raise MixflowError(msg)
        (out / STAMP).write_text(text)
        if libs.exists():
            shutil.rmtree(libs)
        out.rename(libs)
    return libs
