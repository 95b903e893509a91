"""What one step's transaction writes, encoded: every rank's batch (or, for a finished job, the end-of-data
records), the dead letters read since the last step, the step's state record and the source offsets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from pipeline.planning.step.assemble import AssembledStep, StepSummary
from pipeline.planning.step.state import ConstructorState
from pipeline.roles.constructor.writer import PreparedStep, Record
from topics.formats.batch_codec import batch_key, encode_batch_buffer, encode_end_of_data
from topics.formats.dead_letter import DeadLetter, encode_dead_letter
from topics.formats.names import JobTopics


@dataclass(frozen=True)
class StepRecords:
    """Encodes a lane's steps: batches and the state record into partition ``lane`` of ``out``'s topics,
    offsets of partition ``lane`` of ``sources``' source topics."""

    out: JobTopics
    sources: JobTopics
    lane: int
    lanes: int
    ranks: int

    def prepare(
        self,
        assembled: AssembledStep | None,
        state: ConstructorState,
        letters: Sequence[DeadLetter],
        done: Callable[[StepSummary | None, int], None],
        committed: Callable[[StepSummary | None], None],
    ) -> PreparedStep:
        """The transaction of the step before ``state`` (with ``assembled`` None: only the final state), each
        rank's batch built and encoded in turn and its samples let go (``drain_batches``): beside the encoded
        values this holds the samples not yet encoded and one rank's batch. ``done`` gets the step's summary
        and the state record's size once the step is committed (on the main thread); ``committed`` gets the
        summary on the writer thread as soon as it commits."""
        state_bytes = state.to_bytes()
        records: list[Record] = []
        summary = None
        if assembled is not None:
            summary = assembled.summary()
            for batch in assembled.drain_batches():
                key, buffer, headers = encode_batch_buffer(batch)
                records.append(Record(self.out.rank(batch.rank), buffer, key, headers, self.lane))
        step = state.mixer.step
        if state.finished:
            # Readers of a finished job (lane) stop at this record instead of waiting for more steps.
            key, value, headers = encode_end_of_data(step)
            records += [Record(self.out.rank(rank), value, key, headers, self.lane) for rank in range(self.ranks)]
        for letter in letters:
            key, value, headers = encode_dead_letter(letter)
            records.append(Record(self.out.dlq, value, key, headers, 0))
        records.append(Record(self.out.state, state_bytes, batch_key(max(step - self.lanes, 0)), None, self.lane))
        offsets = [TopicPartition(self.sources.src(s), self.lane, p.low) for s, p in state.positions.items()]
        return PreparedStep(
            f"step {step - self.lanes}",
            records,
            offsets,
            lambda: done(summary, len(state_bytes)),
            lambda: committed(summary),
        )
