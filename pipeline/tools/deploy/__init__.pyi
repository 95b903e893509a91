from .links import check_links as check_links
from .manifests import DeployOptions as DeployOptions
from .manifests import Manifest as Manifest
from .manifests import render_job as render_job
from .write import dump as dump
from .write import write_manifests as write_manifests
