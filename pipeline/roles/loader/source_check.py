"""`spec check --files` beyond existence: each source's settings held to its files and its tokenizer before a
sample is read, where a setting would make every document it touches a dead letter.

* A vision token id (``vision_start_id``, ``vision_end_id``, ``image_token_id``, ``video_token_id``) that text
  tokenizes to: an entry of the tokenizer's vocabulary that is not a special token (text holding it is a dead
  letter, and a model reads it as a vision token), or the source's ``eod_token_id``, or the tokenizer's padding
  token. Ids the tokenizer keeps as special tokens, or past its vocabulary, are what vision tokens are.
* ``step.patches_per_micro_batch`` below the patches of an image or clip sampled, or a source's
  ``max_sample_length`` below one's block of tokens (its placeholders with the start and end tokens).
* ``field`` or ``media_fields`` (or a file format) that the records do not match: every record read a dead letter.

Records are sampled (``record_sample``): an item larger than any sampled one is met when it is read, a dead
letter that the run's verdict counts (``pipeline.tools.dead_letters``). An object-store source is listed here
too, naming the store's reason when it cannot be.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from connectors.media.config import VisionConfig
from connectors.media.decode import MediaDecoder
from connectors.readers import MediaFields, SourceNotFoundError, make_reader
from connectors.tokenizer import TextTokenizer
from pipeline.roles.loader.record_sample import FILES_SAMPLED, RECORDS_PER_FILE, RecordSample, sample_records
from pipeline.roles.loader.source_storage import source_storage
from pipeline.spec import JobSpec, SourceSpec, SpecProblem
from topics.errors import MixflowError

VISION_IDS = ("vision_start_id", "vision_end_id", "image_token_id", "video_token_id")
_CHECK_THREADS = 8  # sources checked at once: an object store that does not answer costs one bound, not one each
SAMPLED = f"the first {RECORDS_PER_FILE} records of up to {FILES_SAMPLED} files of each source"


@dataclass(frozen=True)
class SourceCheck:
    problems: list[SpecProblem]
    read: str | None = None  # what was read of the source, when it was


def check_source_settings(
    spec: JobSpec, file: str | Path = "", skip: frozenset[int] = frozenset()
) -> list[SourceCheck]:
    """Each source's problems (see the module's docstring) and what was read of it, in the spec's order; the
    sources numbered in ``skip`` (a missing folder or tokenizer found already) are left out."""
    checked = [(i, source) for i, source in enumerate(spec.sources) if i not in skip]
    if not checked:
        return []
    with ThreadPoolExecutor(min(len(checked), _CHECK_THREADS), thread_name_prefix="spec-check") as pool:
        return list(pool.map(lambda pair: _check(spec, *pair, str(file)), checked))


def _check(spec: JobSpec, i: int, source: SourceSpec, file: str) -> SourceCheck:
    problems = _vision_id_problems(i, source, file) if source.multimodal else []
    try:
        reader = make_reader(
            source.reader.value,
            source.name,
            source.path,
            source.glob,
            source.field or "text",
            content="media" if source.multimodal else "tokens" if source.pretokenized else "text",
            media_fields=None if source.media_fields is None else MediaFields(**source.media_fields.given()),
            storage=source_storage(source),
        )
        files = reader.files()
        vision = None if source.vision is None else VisionConfig(**source.vision.model_dump())
        root = reader.storage if reader.storage.remote else source.path
        sample = sample_records(reader, files, None if vision is None else MediaDecoder(vision, root))
    except SourceNotFoundError as exc:
        return SourceCheck([*problems, SpecProblem(f"sources[{i}].glob", str(exc), source.glob, file)])
    except MixflowError as exc:  # a store that refuses or does not answer
        return SourceCheck([*problems, SpecProblem(f"sources[{i}].path", str(exc), str(source.path), file)])
    problems += _record_problems(i, source, sample, file)
    problems += _size_problems(spec, i, source, sample, file)
    return SourceCheck(problems, f"{source.name}: {sample.describe()}")


def _vision_id_problems(i: int, source: SourceSpec, file: str) -> list[SpecProblem]:
    if source.tokenizer is None or source.vision is None:
        return []
    try:
        tokenizer = TextTokenizer.from_file(source.tokenizer)
    except MixflowError as exc:
        return [SpecProblem(f"sources[{i}].tokenizer", str(exc), str(source.tokenizer), file)]
    problems = []
    for name in VISION_IDS:
        token_id = getattr(source.vision, name)
        if token_id == source.eod_token_id:
            why = "is the source's eod_token_id: every document ends with it, and a model reads it as a vision token"
        elif token_id == tokenizer.padding_id:
            why = f"is the padding token of {source.tokenizer.name}"
        elif (text := tokenizer.text_token(token_id)) is not None:
            why = (
                f"is {text!r}, a text token of {source.tokenizer.name}: every document whose text tokenizes to it is "
                "a dead letter; give the ids of the tokenizer's own vision tokens (special tokens such as "
                f"<|vision_start|>) or ids past its vocabulary of {tokenizer.vocab_size}"
            )
        else:
            continue
        problems.append(SpecProblem(f"sources[{i}].vision.{name}", why, token_id, file))
    return problems


def _record_problems(i: int, source: SourceSpec, sample: RecordSample, file: str) -> list[SpecProblem]:
    letter = sample.first_dead_letter
    if sample.documents or letter is None:
        return []
    if source.multimodal:
        fields = MediaFields(**(source.media_fields.given() if source.media_fields else {}))
        kinds = (("text", "text"), ("images", "image"), ("clips", "video"), ("segments", "segments"))
        kinds += (("conversations", "conversations"), ("texts", "texts"))
        names = ", ".join(f"{what} in {' or '.join(getattr(fields, kind))}" for what, kind in kinds)
        where, looked_for = "media_fields", f"media_fields looks for {names}"
    elif source.field is not None:
        where, looked_for = "field", f"read from field {source.field!r}"
    else:
        where, looked_for = "path", f"read by the {source.reader.value} reader"
    message = (
        f"every record read is a dead letter ({sample.records} records of {_files(sample.files)}; {looked_for}), "
        f"and so would every sample be: {letter.location}: {letter.reason}{_keys(letter.payload)}"
    )
    return [SpecProblem(f"sources[{i}].{where}", message, file=file)]


def _files(count: int) -> str:
    return f"{count} file" + ("s" if count != 1 else "")


def _keys(payload: bytes | None) -> str:
    """``; the record's keys: a, b`` for a JSON object's payload."""
    try:
        record = json.loads(payload) if payload else None
    except ValueError:
        return ""
    return f"; the record's keys: {', '.join(record)}" if isinstance(record, dict) else ""


def _size_problems(spec: JobSpec, i: int, source: SourceSpec, sample: RecordSample, file: str) -> list[SpecProblem]:
    problems = []
    budget = spec.step.patches_per_micro_batch
    if budget is not None and (item := sample.largest()) is not None and item.patches > budget:
        message = (
            f"below the largest {item.noun} read of source {source.name}: {item.where} has {item.patches} patches; "
            "every image or clip over the budget is a dead letter"
        )
        problems.append(SpecProblem("step.patches_per_micro_batch", message, budget, file))
    limit = source.max_sample_length or spec.step.tokens_per_micro_batch
    if (item := sample.largest(by="block")) is not None and item.block > limit:
        message = (
            f"below the longest {item.noun} read: {item.where} takes {item.block} tokens (its placeholders with the "
            "start and end tokens), which no chunk can split; every document holding such an item is a dead letter"
        )
        problems.append(SpecProblem(f"sources[{i}].max_sample_length", message, limit, file))
    return problems
