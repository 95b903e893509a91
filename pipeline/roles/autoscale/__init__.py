"""Loader autoscaling: the policy (pure), the measurements it needs from a job's topics, and the
autoscaler that turns one into the other every interval. ``mixflow run`` acts on its decisions
(``pipeline/tools/run/job.py``); ``mixflow autoscale`` exports them for Kubernetes."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches. The
# names and their modules are listed once, in __init__.pyi, which also gives them their types.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
