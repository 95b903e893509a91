"""mixflow.connectors: readers for data sources, tokenization, sample ids and work-unit planning.

Nothing here talks to Kafka; the source loader role in ``pipeline`` calls it."""

from connectors.cost import measure_cost_per_byte
from connectors.planning import plan_units, shuffle_units, split_file, unit_bytes
from connectors.readers import (
    READERS,
    ArrowReader,
    Document,
    FileLayout,
    JsonlReader,
    ParquetReader,
    Reader,
    SourceNotFoundError,
    TextReader,
    make_reader,
)
from connectors.sample_ids import SampleId, document_id, parse_sample_id, sample_id, with_suffixes
from connectors.samples import Built, SampleBuilder
from connectors.seeding import stable_rng
from connectors.tokenizer import TextTokenizer, TokenizerError
from connectors.work_units import WorkUnit

__all__ = [
    "READERS",
    "ArrowReader",
    "Built",
    "Document",
    "FileLayout",
    "JsonlReader",
    "ParquetReader",
    "Reader",
    "SampleBuilder",
    "SampleId",
    "SourceNotFoundError",
    "TextReader",
    "TextTokenizer",
    "TokenizerError",
    "WorkUnit",
    "document_id",
    "make_reader",
    "measure_cost_per_byte",
    "parse_sample_id",
    "plan_units",
    "sample_id",
    "shuffle_units",
    "split_file",
    "stable_rng",
    "unit_bytes",
    "with_suffixes",
]
