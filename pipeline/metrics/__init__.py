"""What every role's Prometheus metrics share: registries, serving, the endpoints file and the dead-letter
reason classes. Each role defines its own metrics beside it (``pipeline/roles/<role>/metrics.py``;
``trainer_sink.metrics`` defines the sink's, since the sink imports ``topics`` only).

Names follow Prometheus conventions: ``mixflow_<role>_<what>_total`` counters, ``_seconds``, ``_bytes``,
``_tokens`` and ``_ratio`` in the names of what they measure, labels ``job``, ``source``, ``rank`` and
``reason`` (a fixed set of classes: ``reasons.py``), never a sample id. Each role process gets a registry
of its own (``role_registry``), served on its ``--metrics-port``; a role made without one keeps its
metrics in a private registry nobody serves, so tests and replays in one process never collide."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
