"""Mixture changes taken in from ``<job>.control`` before each step: accepted or refused, and what of that the
next state record holds (the accepted changes, the next control offset, the latest refused ids)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pipeline.kafka.control import ControlReader
from pipeline.planning.mixing import Mixer, MixtureChange, refusal
from pipeline.planning.step.state import MAX_REFUSED, ConstructorState
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig

log = logging.getLogger(__name__)


class ControlIntake:
    """The control part of the state record being built, from the last committed state on. A replay gives
    the original's accepted changes (``replay_changes``) and reads no control topic."""

    def __init__(self, state: ConstructorState, replay_changes: Sequence[MixtureChange] | None = None) -> None:
        self.changes: tuple[MixtureChange, ...] = state.changes if replay_changes is None else tuple(replay_changes)
        self.offset = state.control_offset
        self.refused: tuple[str, ...] = state.refused
        self.replaying = replay_changes is not None
        self._reader: ControlReader | None = None

    def open(self, config: KafkaConfig, out: JobTopics) -> ControlReader | None:
        """Start reading ``out``'s control topic at the recorded offset (not in a replay); the reader to close."""
        if not self.replaying:
            self._reader = ControlReader(config, out, self.offset)
        return self._reader

    def mixer(self, base: Mixer) -> Mixer:
        """``base`` with the changes accepted so far."""
        return base.with_changes(self.changes)

    def read(self, next_step: int, lanes: int, sources: Sequence[str]) -> None:
        """Accept or refuse the mixture changes published since the last look; what is decided goes into the
        state record of the next step committed."""
        if self._reader is None:
            return
        for record in self._reader.read_available():
            if record.problem is not None:
                log.warning("ignoring a broken control record: %s", record.problem)
            elif record.change is not None:
                change = record.change
                # This lane builds no step between its last one and its next: a change from any of them
                # is in time for it.
                if reason := refusal(change, next_step - lanes + 1, sources):
                    log.warning("refusing mixture change %s from step %d: %s", change.id, change.from_step, reason)
                    self.refused = (*self.refused, change.id)[-MAX_REFUSED:]
                else:
                    log.info("mixture change %s: from step %d, shares %s", change.id, change.from_step, change.shares)
                    self.changes = (*self.changes, change)
        self.offset = self._reader.next_offset
