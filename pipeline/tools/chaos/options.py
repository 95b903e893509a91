"""What a chaos run is asked to do (``ChaosOptions``), and the error that ends one early (``ChaosError``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.tools.chaos.schedule import FaultKind
from topics.errors import MixflowError


class ChaosError(MixflowError):
    """The run could not go on: a fault was not survived in time, or the job did not start or end."""


@dataclass(frozen=True)
class ChaosOptions:
    spec: Path
    faults: int
    seed: int
    out: Path | None = None  # a new or empty folder; by default <state dir>/chaos/<job>
    shadows: int = 1
    bootstrap: str | None = None  # a broker to use instead of a private one; no broker restarts then
    kinds: tuple[FaultKind, ...] | None = None  # the kinds of fault to draw from; None: every one with a target
    fault_timeout_s: float = 120.0  # for each fault to be survived
    start_timeout_s: float = 300.0  # for the first step to reach every sink
    drain_timeout_s: float = 600.0  # for the job to end once the faults are over
    max_pause_s: float = 2.0  # before each fault, once the previous one was survived
    max_down_s: float = 3.0  # a restarted broker or object store stays down up to this long
    # The folder of a running local object store (``LocalObjectStore``) that the spec's s3:// sources read:
    # the roles reach it through a fault proxy of the run; the run restarts, stalls, slows and refuses it, and
    # revokes the key its loaders read with (a user of the store the run adds).
    object_store: Path | None = None
    max_stall_s: float = 5.0  # an object store is stalled, slow or refusing for 1 s up to this long
    # Rights are revoked for 1 s up to this long, and then until the roles they strike have stopped.
    max_revoke_s: float = 5.0
    max_lead_steps: int | None = None  # overrides the spec's constructor.max_lead_steps (the sinks pace it)
    # The private broker is secured (``mixflow stack up --secure``); each role runs as a SCRAM user of its own
    # with the job's ACLs (``secured.py``).
    secure: bool = False
