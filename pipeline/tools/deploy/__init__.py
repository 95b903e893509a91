"""Kubernetes manifests of a job, made from its spec: ``mixflow deploy render``."""

from pipeline.tools.deploy.links import check_links
from pipeline.tools.deploy.manifests import DeployOptions, Manifest, render_job
from pipeline.tools.deploy.write import dump, write_manifests

__all__ = ["DeployOptions", "Manifest", "check_links", "dump", "render_job", "write_manifests"]
