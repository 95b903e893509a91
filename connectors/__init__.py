"""mixflow.connectors: readers for data sources, tokenization, sample ids and work-unit planning.

Nothing here talks to Kafka; the source loader role in ``pipeline`` calls it."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
