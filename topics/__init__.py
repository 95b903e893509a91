"""mixflow.topics: what is on a job's topics and how to reach them.

- ``topics.formats``: the wire formats, the external contract (``FORMAT.md``): topic names and layout, the
  sample (Avro), batch (Arrow IPC), dead-letter and progress records, media. No Kafka client.
- ``topics.kafka``: the Kafka client plumbing every side uses, the trainer's included: settings and
  clients, administration and ACLs, probes, authorization refusals, retries, offset lookups, consumers
  that renew a stalled client, reading a topic to its end, finding a step.
- ``topics.errors`` (the error types every package raises) and ``topics.retry`` (the one retry policy).

This package imports nothing from ``pipeline``, ``connectors`` or ``trainer_sink``."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
