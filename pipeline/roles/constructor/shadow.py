"""A constructor instance that does not hold the lease follows the job as a shadow: ready to take over from
the last committed step, and done when the job is."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum

from confluent_kafka import KafkaException

from pipeline.planning.step.state import ConstructorState
from pipeline.roles.constructor.lease import ConstructorLease
from topics.kafka.authorization import is_authorization_error, refused
from topics.kafka.retry import KafkaUnavailableError

log = logging.getLogger(__name__)

SHADOW_LOOK_S = 10.0
"""How long a shadow's look at the job's state may take (it looks every 2 s)."""
LOOK_EVERY_S = 2.0


class ShadowEnd(Enum):
    LEASE = "lease"  # this instance holds the lease: it is the active one now
    FINISHED = "finished"  # the job is finished
    STOPPED = "stopped"  # a signal stopped this instance


class ShadowFollower:
    """Waits for the lease while looking at the job's last state (``look_at_state(timeout_s)``) every 2 s.

    A lease consumer can miss its way back into the group after a broker restart: when the job has not moved
    for ``stalled_s``, or the brokers have not counted this instance a member for that long, it joins again
    as a new member (harmless if an active one merely waits)."""

    def __init__(
        self,
        lease: ConstructorLease,
        instance: str,
        job: str,
        look_at_state: Callable[[float], ConstructorState],
        stopping: Callable[[], bool],
        stalled_s: float,
    ) -> None:
        self.lease = lease
        self.instance = instance
        self.job = job
        self.look_at_state = look_at_state
        self.stopping = stopping
        self.stalled_s = stalled_s
        self._last_look = self._last_member_look = 0.0
        self._seen_step, self._seen_at = -1, time.monotonic()
        self._outside_since: float | None = None

    def follow(self) -> ShadowEnd:
        """Follow the job until this instance holds the lease, the job is finished or a signal stops it."""
        if self.lease.wait_for_first_assignment(timeout_s=10.0):
            return ShadowEnd.LEASE
        log.info("constructor %s of %s: shadow, waiting for the lease", self.instance, self.job)
        while not self.stopping():
            if self.lease.poll(0.2):
                return ShadowEnd.LEASE
            if time.monotonic() - self._last_member_look > self.stalled_s / 3:
                self._check_membership()
            if time.monotonic() - self._last_look > LOOK_EVERY_S and self._job_finished():
                return ShadowEnd.FINISHED
        return ShadowEnd.STOPPED

    def _check_membership(self) -> None:
        self._last_member_look = now = time.monotonic()
        self._outside_since = None if self.lease.in_group() else (self._outside_since or now)
        if self._outside_since is not None and now - self._outside_since > self.stalled_s:
            log.info("shadow %s: not in the lease group for %.0f s; joining again", self.instance, self.stalled_s)
            self.lease.rejoin()
            self._outside_since = None

    def _job_finished(self) -> bool:
        """Look at the job's state: True when it is finished; rejoin the lease group when it has not moved."""
        self._last_look = time.monotonic()
        try:
            # A short look: a client left stuck by a broker restart is dropped for a new one at the next look,
            # rather than holding the shadow for the client's default minute.
            state = self.look_at_state(SHADOW_LOOK_S)
        except (KafkaException, KafkaUnavailableError, TimeoutError) as exc:
            if isinstance(exc, KafkaException) and exc.args and is_authorization_error(exc.args[0]):
                raise refused(self.lease.config, "READ", "topic", f"{self.job}.state", "following the job") from exc
            log.info("shadow %s: cannot read the job's state now (%s); waiting", self.instance, exc)
            return False
        if state.finished:
            log.info("job %s finished at step %d (followed as a shadow)", self.job, state.step)
            return True
        if state.step != self._seen_step:
            self._seen_step, self._seen_at = state.step, time.monotonic()
        elif time.monotonic() - self._seen_at > self.stalled_s:
            log.info("shadow %s: no step for %.0f s; joining the lease group again", self.instance, self.stalled_s)
            self.lease.rejoin()
            self._seen_at = time.monotonic()
        log.debug("shadow %s: the active constructor is at step %d", self.instance, state.step)
        return False
