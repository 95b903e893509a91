"""The determinism audit: a replayed job's steps against the original's, step by step.

Under the original's step shape a replay must write the same records: every rank's key, headers and
value, byte for byte. Under another shape each step must hold the same samples with the same tokens and
media (each image's or clip's layout and frame bytes), each once (the batches' own checks keep every
micro-batch within its capacity and its patch budget). A context-parallel step's samples are put back together
from their slices first, on both sides (``cp_samples``): each sample whole from exactly one slice on every rank
of its block, labelled with its next tokens.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

from pipeline.kafka.state_topic import JobHistory
from pipeline.tools.replay.cp_samples import SlicesError, whole_samples
from pipeline.tools.replay.steps import StepMessages, read_steps
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_any_batch_message
from topics.formats.cp_batch import CPBatch
from topics.formats.media import MediaItem
from topics.kafka.clients import KafkaConfig


@dataclass(frozen=True)
class Audit:
    """``steps`` compared (and the end of the job, with ``end``); the first difference found, if any."""

    steps: int
    end: bool
    mismatch: str | None

    def to_dict(self) -> dict[str, object]:
        return {"steps_compared": self.steps, "end_compared": self.end, "mismatch": self.mismatch}


def same_records(original: StepMessages, replayed: StepMessages) -> str | None:
    """Where the replayed records of a step first differ from the original's, byte for byte."""
    if len(original.messages) != len(replayed.messages):
        return f"step {original.step}: {len(replayed.messages)} ranks, the original has {len(original.messages)}"
    for rank, (o, r) in enumerate(zip(original.messages, replayed.messages, strict=True)):
        where = f"step {original.step} rank {rank}" if not original.end else f"the end-of-data record of rank {rank}"
        if r.key() != o.key():
            return f"{where}: key {r.key()!r}, the original's is {o.key()!r}"
        if (r.headers() or []) != (o.headers() or []):
            return f"{where}: headers {r.headers()}, the original's are {o.headers()}"
        if r.value() != o.value():
            return f"{where}: the value differs ({len(r.value() or b'')} bytes, the original's {len(o.value() or b'')})"
    return None


def same_samples(original: StepMessages, replayed: StepMessages) -> str | None:
    """Where a step replayed under another shape first differs from the original: other samples, other
    tokens or media, or a sample twice."""
    if original.end:
        return None  # both are the end after the same number of steps (read_steps checked)
    try:
        before = _samples(original)
    except SlicesError as exc:
        return f"the original's {exc}"
    try:
        after = _samples(replayed)
    except SlicesError as exc:
        return str(exc)
    counts = Counter(i for i, _ in after)
    if twice := [i for i, n in counts.items() if n > 1]:
        return f"step {original.step}: sample {twice[0]} is there {counts[twice[0]]} times"
    got, expected = dict(after), dict(before)
    if missing := sorted(expected.keys() - got.keys()):
        return f"step {original.step}: {len(missing)} samples of the original are missing, {missing[0]} first"
    if extra := sorted(got.keys() - expected.keys()):
        return f"step {original.step}: {len(extra)} samples are not in the original step, {extra[0]} first"
    for sample_id in sorted(expected):
        (tokens, media), (original_tokens, original_media) = got[sample_id], expected[sample_id]
        if tokens != original_tokens:
            return f"step {original.step}: sample {sample_id} has other tokens"
        if media != original_media:
            return f"step {original.step}: sample {sample_id} has other media"
    return None


def _samples(step: StepMessages) -> list[tuple[str, tuple[bytes, tuple[MediaItem, ...]]]]:
    """Each sample of the step: its id, and its tokens' bytes and media items (frames included). A
    context-parallel step's samples are whole again, each once (else ``SlicesError``)."""
    batches = [decode_any_batch_message(m) for m in step.messages]
    slices = [b for b in batches if isinstance(b, CPBatch)]
    samples = whole_samples(slices) if slices else []
    samples += [s for b in batches if isinstance(b, Batch) for s in b.samples()]
    return [(s.sample_id, (s.tokens.tobytes(), s.media)) for s in samples]


def audit(
    config: KafkaConfig, original: JobHistory, replayed: JobHistory, first: int, same_shape: bool | None = None
) -> Audit:
    """Every step ``replayed`` holds from ``first`` on against ``original``'s same step, and its end: byte for
    byte with ``same_shape`` (None: where the two jobs' written shapes are the same), else sample by sample
    (as a context-parallel job's steps replayed over the same ranks with other micro-batches must be)."""
    if original.shape is None or replayed.shape is None:
        return Audit(0, False, None)
    if replayed.finished and (not original.finished or original.steps != replayed.steps):
        ended = f"after {original.steps} steps" if original.finished else "not yet"
        return Audit(0, False, f"{replayed.job} ended after {replayed.steps} steps; {original.job} ended {ended}")
    same = replayed.shape == original.shape if same_shape is None else same_shape
    compare = same_records if same else same_samples
    last, end = replayed.steps - 1, replayed.finished
    ours = read_steps(config, original.job, original.shape.ranks, first, last, end=end)
    theirs = read_steps(config, replayed.job, replayed.shape.ranks, first, last, end=end)
    compared = 0
    with contextlib.closing(ours), contextlib.closing(theirs):
        for o, r in zip(ours, theirs, strict=True):
            if mismatch := compare(o, r):
                return Audit(compared, False, mismatch)
            compared += 0 if o.end else 1
    return Audit(compared, end, None)
