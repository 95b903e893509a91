"""mixflow.connectors: readers for data sources, tokenization, sample ids and work-unit planning.

Nothing here talks to Kafka; the source loader role in ``pipeline`` calls it."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "cost": ["measure_cost_per_byte"],
        "planning": ["plan_units", "shuffle_units", "split_file", "unit_bytes"],
        "readers": [
            "READERS",
            "ArrowReader",
            "Document",
            "FileLayout",
            "JsonlReader",
            "ParquetReader",
            "Reader",
            "SourceNotFoundError",
            "TextReader",
            "make_reader",
        ],
        "sample_ids": ["SampleId", "document_id", "parse_sample_id", "sample_id", "with_suffixes"],
        "samples": ["Built", "SampleBuilder"],
        "seeding": ["stable_rng"],
        "tokenizer": ["TextTokenizer", "TokenizerError"],
        "work_units": ["WorkUnit"],
    },
)
