"""Kubernetes manifests of a job, made from its spec: ``mixflow deploy render``."""

import lazy_loader

# Each name is imported from its module on first use: a process loads only the modules it touches.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "links": ["check_links"],
        "manifests": ["DeployOptions", "Manifest", "render_job"],
        "write": ["dump", "write_manifests"],
    },
)
