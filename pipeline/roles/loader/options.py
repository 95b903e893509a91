"""How one source loader process runs: its instance, when it stops, its timeouts and its unit sizes."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.roles.loader.defaults import SESSION_TIMEOUT_MS
from pipeline.roles.loader.source_runtime import TARGET_UNIT_SECONDS
from topics.kafka.fetch_stall import STALL_AFTER_S
from topics.kafka.group_membership import DEFAULT_REJOIN_AFTER_S


@dataclass(frozen=True)
class LoaderOptions:
    instance: int = 0
    until_drained: bool = False
    transaction_timeout_ms: int = 60_000
    # A dead loader's units move to the others after this long. (Static membership would hand them
    # back to a restarted instance at once, but a static member cannot leave the group when it exits,
    # so every clean exit would stall the others for this long, and a broker restart fences it.)
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    # A loader without an assignment this long replaces its consumer (see topics.kafka.group_membership).
    rejoin_after_s: float = DEFAULT_REJOIN_AFTER_S
    # A loader whose work partition delivers nothing this long while units lie past it rejoins
    # (topics.kafka.fetch_stall).
    stall_after_s: float = STALL_AFTER_S
    poll_timeout_s: float = 1.0
    plan_wait_s: float = 600.0
    unit_seconds: float = TARGET_UNIT_SECONDS
    # Leave the group after this many units (to recycle or scale down a loader); None: no limit.
    max_units: int | None = None
    # The job's policy is next_epoch: stay when the plan is done (until_drained does not end the loader),
    # and instance 0 plans the epochs the constructor asks for.
    next_epoch: bool = False
