"""The end of a chaos run: an audit of what the job delivered, made from the topics (read_committed) and the
data files alone, not from anything the roles say about themselves.

- every rank topic holds steps 0..K-1 in order and then the end-of-data record of K steps, each batch of
  the spec's shape and within capacity (a context-parallel job's of format version 2 or 3);
- every sample the committed work units give when tokenized here is in the rank topics exactly once,
  with the same tokens (a context-parallel sample's put back together from the slices of its block), and
  nothing else is; every committed source sample reached a rank topic;
- each sink's record equals its rank's micro-batches, in order, with none lost or repeated over its
  restarts;
- every dead letter is one the data gives when read here: a fault (a storage key revoked, say) never made one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.planning.shape import StepShape
from pipeline.spec import JobSpec, StepSpec
from pipeline.tools.delivery import (
    RECEIVED_FILE,
    SourceCheck,
    check_sources,
    delivered_samples,
    expected_samples,
    rank_micro_batches,
    received_micro_batches,
)
from topics.errors import DecodeError
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.dead_letter import DeadLetter, decode_dead_letter_message
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end

SHOWN = 3  # examples named per kind of problem


@dataclass
class JobAudit:
    steps: int = 0
    samples: int = 0
    expected: int = 0
    sink_micro_batches: list[int] = field(default_factory=list)
    dead_letters: int = 0  # on the dead-letter topic
    source_check: SourceCheck | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        verdict = "yes" if self.ok else f"NO ({len(self.problems)} problems)"
        out = [
            f"steps {self.steps} on every rank, contiguous, each batch within capacity, then the end of data; "
            f"every expected sample exactly once with its tokens ({self.samples} of {self.expected}); each "
            f"sink's record equals its rank topic ({' and '.join(map(str, self.sink_micro_batches))} "
            f"micro-batches): {verdict}",
        ]
        if self.source_check is not None:
            out.append(self.source_check.line(stopped_early=False))
        out.append(f"dead letters: {self.dead_letters}, each one the data gives when read again")
        return out + [f"  problem: {problem}" for problem in self.problems]


def audit_job(config: KafkaConfig, spec: JobSpec, sink_folder: Path) -> JobAudit:
    audit = JobAudit()
    lanes = spec.constructor.lanes
    per_rank = [
        read_rank_topic(config, spec.job, rank, spec.step, audit.problems, lanes=lanes)
        for rank in range(spec.step.ranks)
    ]
    audit.steps = min(len(batches) for batches in per_rank)
    if len({len(batches) for batches in per_rank}) > 1:
        audit.problems.append(f"the ranks hold different numbers of steps: {[len(b) for b in per_rank]}")
    expected: dict[str, str] = {}
    letters: list[DeadLetter] = []
    for source in spec.source_names:
        expected.update(expected_samples(spec, config, source, letters))
    audit.dead_letters = check_dead_letters(config, spec.job, letters, audit.problems)
    delivered = check_samples(per_rank, expected, audit.problems)
    audit.samples, audit.expected = len(delivered), len(expected)
    audit.source_check = check_sources(config, spec.job, spec.source_names, delivered)
    if audit.source_check.missing or audit.source_check.unknown:
        audit.problems.append(audit.source_check.line(stopped_early=False))
    for rank, batches in enumerate(per_rank):
        path = sink_folder / RECEIVED_FILE.format(rank=rank)
        audit.sink_micro_batches.append(check_sink_record(path, batches, audit.problems))
    return audit


def read_rank_topic(
    config: KafkaConfig, job: str, rank: int, step: StepSpec, problems: list[str], lanes: int = 1
) -> list[Batch | CPBatch]:
    """The rank topic's batches in step order; what breaks their order, their shape or the end-of-data
    record after them goes to ``problems``. With constructor ``lanes``, partition ``j`` holds lane ``j``'s
    steps ``j, j + lanes, ...`` and then its end-of-data record, which names the lane's next step."""
    topic = JobTopics(job).rank(rank)
    shape = StepShape.from_spec(step).written()
    by_lane: dict[int, list[Batch | CPBatch]] = {lane: [] for lane in range(lanes)}
    ends: dict[int, int] = {}
    for record in read_to_end(config, topic, timeout_s=300):
        lane = record.partition()
        batches = by_lane.setdefault(lane, [])
        where = f"{topic}[{lane}]@{record.offset()}" if lanes > 1 else f"{topic}@{record.offset()}"
        if lane in ends:
            problems.append(f"{where}: a record after the end-of-data record")
        if (steps := end_of_data_steps(record.headers())) is not None:
            ends[lane] = steps
            continue
        try:
            batch = decode_any_batch_message(record)
        except DecodeError as exc:  # a micro-batch over capacity, among others
            problems.append(f"{where}: {exc}")
            continue
        due = lane + lanes * len(batches)
        if batch.step != due:
            problems.append(f"{where}: step {batch.step} where step {due} was due")
        if batch.rank != rank or StepShape.of_batch(batch) != shape:
            problems.append(f"{where}: rank {batch.rank} of {batch.ranks}, {batch.micro_batches} x {batch.capacity}")
        batches.append(batch)
    for lane, batches in by_lane.items():
        if ends.get(lane) != lane + lanes * len(batches):
            name = f"{topic}[{lane}]" if lanes > 1 else topic
            problems.append(f"{name}: {len(batches)} steps, but the end-of-data record says {ends.get(lane)}")
    return sorted((b for batches in by_lane.values() for b in batches), key=lambda b: b.step)


def check_samples(per_rank: list[list[Batch | CPBatch]], expected: dict[str, str], problems: list[str]) -> Counter[str]:
    """Every sample of ``expected`` (id to ``sample_sha256``) delivered once with those tokens and media
    bytes, and nothing else; the ids delivered, with their counts."""
    delivered, tokens, broken = delivered_samples(b for batches in per_rank for b in batches)
    _problem(problems, "context-parallel samples whose block's slices do not make the sample", sorted(broken))
    _problem(problems, "samples delivered more than once", [f"{i} x{n}" for i, n in delivered.items() if n > 1])
    _problem(problems, "expected samples never delivered", sorted(expected.keys() - delivered.keys()))
    _problem(problems, "samples delivered that no work unit gives", sorted(delivered.keys() - expected.keys()))
    changed = sorted(i for i in expected.keys() & delivered.keys() if expected[i] != tokens.get(i))
    _problem(problems, "samples delivered with other tokens or media than the data gives", changed)
    return delivered


def check_dead_letters(config: KafkaConfig, job: str, given: list[DeadLetter], problems: list[str]) -> int:
    """The job's dead letters against ``given``, those the data gives when read here: one the data does not
    give (a fault or a refusal taken for bad data) is a problem. How many the topic holds."""
    expected = {(letter.source, letter.location, letter.reason) for letter in given}
    found = [decode_dead_letter_message(record) for record in read_to_end(config, JobTopics(job).dlq)]
    unexpected = sorted({(d.source, d.location, d.reason) for d in found} - expected)
    _problem(problems, "dead letters the data does not give", [f"{s} {where}: {why}" for s, where, why in unexpected])
    return len(found)


def check_sink_record(path: Path, batches: list[Batch | CPBatch], problems: list[str]) -> int:
    """A sink's record against its rank's micro-batches, exactly: a micro-batch recorded twice is a problem
    too (``pipeline.tools.delivery.trained_sequence`` would forgive it as a resume). The lines recorded."""
    if not path.exists():
        problems.append(f"no sink record {path}")
        return 0
    got = received_micro_batches(path)
    expected = rank_micro_batches(batches)
    if got != expected:
        repeated = [k for k, n in Counter((g[0], g[1]) for g in got).items() if n > 1]
        first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        where = f"the first difference at line {first + 1}" if first is not None else "one is a prefix of the other"
        problems.append(
            f"{path.name} holds {len(got)} micro-batches, the rank topic {len(expected)}: {where}; "
            f"(step, micro-batch) recorded more than once: {repeated[:SHOWN] or 'none'}"
        )
    return len(got)


def _problem(problems: list[str], what: str, examples: list[str]) -> None:
    if examples:
        problems.append(f"{len(examples)} {what}, e.g. {', '.join(examples[:SHOWN])}")
