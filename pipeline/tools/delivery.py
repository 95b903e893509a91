"""Exactly once, checked end to end: what the source topics committed against what the rank topics hold,
and what the rank topics hold against what each trainer rank says it received."""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from connectors import Document, WorkUnit
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import JobSpec
from pipeline.tools.dead_letters import SourceLetters, tally
from topics.formats.batch import Batch
from topics.formats.cp_batch import CPBatch
from topics.formats.cp_packing import pack_cp_micro_batches
from topics.formats.cp_slices import reassemble
from topics.formats.dead_letter import DeadLetter, decode_dead_letter_message
from topics.formats.media import MediaItem
from topics.formats.names import JobTopics
from topics.formats.packing import pack_micro_batches
from topics.kafka.clients import KafkaConfig
from topics.kafka.log_reader import read_to_end

# A sample id's chunk suffix (connectors/sample_ids.py): what tells a document's chunks apart.
_CHUNK = re.compile(r"#(0|[1-9][0-9]*)(?=(@e[1-9][0-9]*)?$)")
_EPOCH = re.compile(r"@e[1-9][0-9]*$")

MicroBatchRecord = tuple[int, int, list[str], str]
"""(step, micro-batch, sample ids, tokens_sha256): one micro-batch as a trainer rank records it."""

RECEIVED_FILE = "received-rank{rank}.jsonl"
"""Per trainer rank, one JSON line per micro-batch trained: ``step``, ``micro_batch``, ``micro_batches`` (the
rank's in the step), ``sample_ids`` and ``tokens_sha256`` (sha256 of the micro-batch's token ids as little-endian
int32), in training order."""


def tokens_sha256(token_ids: np.ndarray) -> str:
    """The digest a trainer records for a micro-batch's token ids."""
    return hashlib.sha256(np.ascontiguousarray(token_ids, dtype="<i4").tobytes()).hexdigest()


def sample_sha256(tokens: np.ndarray, media: Sequence[MediaItem] = ()) -> str:
    """A sample's digest: its tokens (``tokens_sha256`` for a sample without media), then each media item's
    layout and the bytes of its frames."""
    digest = hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
    for item in media:
        layout = [item.kind, *item.grid, item.merge_size, item.temporal_patch_size, item.height, item.width]
        digest.update(json.dumps([*layout, item.token_offset, item.encoding, len(item.frames)]).encode())
        for frame in item.frames:
            digest.update(len(frame).to_bytes(8, "little"))
            digest.update(frame)
    return digest.hexdigest()


def batch_sample_digests(batch: Batch) -> list[str]:
    """``sample_sha256`` of each row of ``batch``, media included."""
    offsets, flat = batch.offsets, batch.tokens
    media = batch.media if batch.with_media else None
    return [
        sample_sha256(flat[offsets[i] : offsets[i + 1]], media.row_items(i) if media is not None else ())
        for i in range(batch.num_samples)
    ]


def delivered_samples(batches: Iterable[Batch | CPBatch]) -> tuple[Counter[str], dict[str, str], list[str]]:
    """What ``batches`` deliver: each sample id with how many times, and its ``sample_sha256`` (a context-parallel
    sample's of its tokens put back together from the slices of its block); and the context-parallel samples whose
    slices do not make the sample (one missing, or one of another length)."""
    delivered: Counter[str] = Counter()
    digests: dict[str, str] = {}
    slices: dict[str, dict[int, list[np.ndarray]]] = {}
    lengths: dict[str, tuple[int, int]] = {}
    for batch in batches:
        if not isinstance(batch, CPBatch):
            for sample_id, digest in zip(batch.sample_ids, batch_sample_digests(batch), strict=True):
                delivered[sample_id] += 1
                digests[sample_id] = digest
            continue
        offsets, tokens = batch.offsets, batch.tokens
        columns = (batch.lengths, batch.cp_size, batch.cp_rank)
        rows = zip(batch.sample_ids, *(c.tolist() for c in columns), strict=True)
        for row, (sample_id, length, size, rank_in) in enumerate(rows):
            slices.setdefault(sample_id, {}).setdefault(rank_in, []).append(tokens[offsets[row] : offsets[row + 1]])
            lengths[sample_id] = (length, size)
    broken = []
    for sample_id, held in slices.items():
        length, size = lengths[sample_id]
        delivered[sample_id] += max(len(parts) for parts in held.values())
        try:
            whole = reassemble([held[k][0] for k in range(size)], length)
        except (KeyError, ValueError):
            broken.append(sample_id)
            continue
        digests[sample_id] = sample_sha256(whole)
    return delivered, digests, broken


def received_line(micro_batch: Mapping[str, Any]) -> str:
    """The line of a received file (``RECEIVED_FILE``) a trainer writes for a micro-batch the sink yielded."""
    line = {
        "step": micro_batch["step"],
        "micro_batch": micro_batch["micro_batch"],
        "micro_batches": micro_batch["micro_batches"],
        "sample_ids": list(micro_batch["sample_ids"]),
        "tokens_sha256": tokens_sha256(micro_batch["input_ids"].numpy()),
    }
    return json.dumps(line) + "\n"


@dataclass(frozen=True)
class SourceCheck:
    committed: int  # samples committed to the source topics, less those dead-lettered by the constructor
    missing: int  # committed samples no rank topic holds
    unknown: int  # samples in the rank topics that no source topic committed
    dead_letters: tuple[SourceLetters, ...] = ()  # per source: its dead letters against its records

    def line(self, stopped_early: bool) -> str:
        delivered = self.committed - self.missing
        if self.missing == 0 and self.unknown == 0:
            return f"every committed source sample reached a rank topic: yes ({delivered} of {self.committed})"
        why = " (on_exhausted: stop ends the job with samples left in the sources)" if stopped_early else ""
        return (
            f"committed source samples in the rank topics: {delivered} of {self.committed}, {self.missing} not "
            f"delivered{why}, {self.unknown} not from any source"
        )


def check_sources(config: KafkaConfig, job: str, sources: list[str], delivered: Counter[str]) -> SourceCheck:
    """Committed source samples against ``delivered`` (the rank topics' sample ids), and each source's dead
    letters against its records: its documents on the source topic (a document's chunks count once) and the
    records its loaders dead-lettered (the constructor's dead letters are of samples already on the topic),
    a letter for a work unit counting the unit's records (``lost_records``)."""
    topics = JobTopics(job)
    letters = [decode_dead_letter_message(message) for message in read_to_end(config, topics.dlq)]
    rejected = {letter.location for letter in letters}
    committed: set[str] = set()
    documents: dict[str, int] = {}
    per_file: dict[str, float] = {}
    for source in sources:
        read: set[str] = set()
        for record in read_to_end(config, topics.src(source)):
            sample = record.key().decode()
            read.add(_CHUNK.sub("", sample))
            if f"{record.topic()}[{record.partition()}]@{record.offset()}" not in rejected:
                committed.add(sample)
        documents[source], per_file[source] = len(read), records_per_file(read)
    records = dict(documents)
    lost: Counter[tuple[str, str]] = Counter()
    for letter in letters:
        loaders = letter.source in per_file and not letter.location.startswith(f"{topics.src(letter.source)}[")
        count = lost_records(letter, per_file[letter.source]) if loaders else 1
        lost[(letter.source, letter.reason)] += count
        if loaders:
            records[letter.source] += count
    return SourceCheck(
        committed=len(committed),
        missing=len(committed - delivered.keys()),
        unknown=len(delivered.keys() - committed),
        dead_letters=tuple(tally(Counter((letter.source, letter.reason) for letter in letters), records, lost)),
    )


def lost_records(letter: DeadLetter, per_file: float) -> int:
    """The records ``letter`` stands for: those it counts; for a work unit whose rows the plan did not count
    (a small object planned from its listing, a file that could not be inspected), ``per_file``, the source's
    records per file and epoch, rounded (at least 1); else one."""
    if letter.records is not None:
        return letter.records
    return max(1, round(per_file)) if letter.unit is not None else 1


def records_per_file(documents: set[str]) -> float:
    """The mean records of one file in one epoch among the document ids ``documents`` (``<source>/<path>/<row>``,
    then ``@e<n>`` after the first epoch); 1 without any."""
    files = {_file_and_epoch(document) for document in documents}
    return len(documents) / len(files) if files else 1.0


def _file_and_epoch(document_id: str) -> tuple[str, str]:
    epoch = _EPOCH.search(document_id)
    base = document_id[: epoch.start()] if epoch else document_id
    return base.rpartition("/")[0], epoch.group() if epoch else ""


@dataclass(frozen=True)
class TrainerCheck:
    ranks: int
    micro_batches: int  # micro-batches the trainer ranks were to train (those of the steps they ran)
    received: int  # micro-batches the trainer ranks recorded, after resumes
    steps_trained: int  # steps the trainer ran (all the rank topics hold, unless it stopped early)
    steps_written: int
    problems: list[str]

    def line(self) -> str:
        if not self.problems:
            scope = (
                f"steps 0-{self.steps_trained - 1} of the {self.steps_written} written (it stopped there)"
                if self.steps_trained < self.steps_written
                else "every step"
            )
            return (
                f"the trainer received every micro-batch exactly as written: yes ({self.received} micro-batches on "
                f"{self.ranks} ranks, {scope}; sample ids and token bytes compared)"
            )
        more = len(self.problems) - 3
        shown = "; ".join(self.problems[:3]) + (f"; and {more} more" if more > 0 else "")
        return f"the trainer received every micro-batch exactly as written: NO ({shown})"


def check_trainer(folder: Path, steps: Sequence[Sequence[Batch | CPBatch]]) -> TrainerCheck:
    """Compare each rank's received file in ``folder`` with that rank's micro-batches, in order, up to
    the step where the trainer says it stopped (``end_step`` in ``trainer-rank<r>.json``)."""
    ranks = len(steps[0]) if steps else 0
    problems: list[str] = []
    received = total = 0
    trained = len(steps)
    for rank in range(ranks):
        summary = folder / f"trainer-rank{rank}.json"
        end = json.loads(summary.read_text()).get("end_step", len(steps)) if summary.exists() else len(steps)
        trained = min(trained, end)
        expected = rank_micro_batches([step[rank] for step in steps[:end]])
        total += len(expected)
        path = folder / RECEIVED_FILE.format(rank=rank)
        if not path.exists():
            problems.append(f"rank {rank} recorded nothing ({path} is missing)")
            continue
        got_tuples = trained_sequence(received_micro_batches(path))
        received += len(got_tuples)
        if got_tuples != expected:
            first = next((i for i, (a, b) in enumerate(zip(got_tuples, expected, strict=False)) if a != b), None)
            where = f"first difference at micro-batch {first}" if first is not None else "lengths differ"
            problems.append(f"rank {rank}: {len(got_tuples)} micro-batches received, {len(expected)} written, {where}")
    return TrainerCheck(ranks, total, received, trained, len(steps), problems)


def rank_micro_batches(batches: Sequence[Batch | CPBatch]) -> list[MicroBatchRecord]:
    """One rank's micro-batches of ``batches``, in order, as a trainer records them: of a context-parallel batch,
    its slices' (the one empty micro-batch the sink hands over for a step without any)."""
    out = []
    for batch in batches:
        packed = pack_cp_micro_batches(batch) if isinstance(batch, CPBatch) else pack_micro_batches(batch)
        out += [(batch.step, m, p.sample_ids, tokens_sha256(p.token_ids)) for m, p in enumerate(packed)]
        if not packed and isinstance(batch, CPBatch):
            out.append((batch.step, 0, [], tokens_sha256(np.zeros(0, np.int32))))
    return out


def received_micro_batches(path: Path) -> list[MicroBatchRecord]:
    """The lines of a received file (``RECEIVED_FILE``), in the order written."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(line["step"], line["micro_batch"], line["sample_ids"], line["tokens_sha256"]) for line in lines]


def expected_samples(
    spec: JobSpec, config: KafkaConfig, source: str, letters: list[DeadLetter] | None = None
) -> dict[str, str]:
    """Sample id to ``sample_sha256`` of its tokens and media, for every sample the source's committed work units
    give when read and tokenized here, without the loaders: what an undisturbed run delivers. The dead letters
    the same reading gives are appended to ``letters``, when given."""
    runtime = SourceRuntime.from_spec(spec, source)
    samples: dict[str, str] = {}
    for record in read_to_end(config, JobTopics(spec.job).work(source)):
        unit = WorkUnit.from_json(record.value())
        read = list(runtime.reader.read(unit))
        documents = [d for d in read if isinstance(d, Document)]
        built = runtime.builder.build(documents, epoch=unit.epoch)
        for sample in built.samples:
            samples[sample.sample_id] = sample_sha256(sample.tokens, sample.media)
        if letters is not None:
            letters += [d for d in read if isinstance(d, DeadLetter)] + built.dead_letters
    return samples


def trained_sequence(lines: list[tuple]) -> list[tuple]:
    """The micro-batches a trainer rank's model kept, from its received log: a line at or before the
    previous line's (step, micro-batch) is a resume from a checkpoint and replaces what followed it."""
    kept: list[tuple] = []
    for line in lines:
        if kept and line[:2] <= kept[-1][:2]:
            del kept[bisect.bisect_left([k[:2] for k in kept], line[:2]) :]
        kept.append(line)
    return kept


@dataclass(frozen=True)
class TrainerSummary:
    """What the trainer ranks reported about themselves (``trainer-rank<r>.json``)."""

    tokens: int
    seconds: float
    pss_bytes: list[int]
    prefetch_peak_bytes: list[int]
    loss_first: float | None
    loss_last: float | None

    @classmethod
    def read(cls, folder: Path) -> TrainerSummary | None:
        ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("trainer-rank*.json"))]
        if not ranks:
            return None
        return cls(
            tokens=sum(r["tokens"] for r in ranks),
            seconds=max(r["seconds"] for r in ranks),
            pss_bytes=[r.get("pss_bytes") or r.get("rss_bytes", 0) for r in ranks],
            prefetch_peak_bytes=[r.get("prefetch_peak_bytes", 0) for r in ranks],
            loss_first=ranks[0].get("loss_first"),
            loss_last=ranks[0].get("loss_last"),
        )

    def lines(self) -> list[str]:
        mib = 1024 * 1024
        out = [
            f"tokens into the ranks: {self.tokens} in {self.seconds:.1f} s of training, "
            f"{self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s",
            "trainer-side memory per rank (process PSS, model and torch included): "
            + ", ".join(f"{b / mib:.0f} MiB" for b in self.pss_bytes)
            + "; the sink's prefetch buffer peaked at "
            + ", ".join(f"{b / mib:.1f} MiB" for b in self.prefetch_peak_bytes),
        ]
        if self.loss_first is not None and self.loss_last is not None:
            out.append(
                f"training loss (rank 0): {self.loss_first:.3f} at the first step, {self.loss_last:.3f} at the last"
            )
        return out
