"""A job's Kubernetes objects, as plain dicts, made from its spec.

- a ConfigMap holding the spec, mounted into every pod at ``/etc/mixflow/<spec file name>``; its paths
  relative to the spec's folder are rewritten to the same paths under the data volume's mount (a
  PersistentVolumeClaim holding the sources' files and tokenizers, laid out as beside the spec);
- per source, a StatefulSet of loaders. Its pods' ordinals are the loaders' ``--instance``: stable, so a
  restarted pod reuses its ``transactional.id`` and fences its dead predecessor at once, and ordinal 0,
  the source's planner, is the last one a scale-down removes;
- per constructor lane, a Deployment of two ``mixflow construct`` pods: the lease elects one, the other
  is its shadow;
- with the spec's ``autoscaling.enabled``: an autoscaler Deployment exporting
  ``mixflow_autoscaler_desired_loaders{job,source}`` (with a Service Prometheus scrapes), and per source
  with an ``autoscale`` section a KEDA ScaledObject that sets the loaders' replicas to that gauge;
- on a secured cluster (``kafka_secrets``): each role's pods mount the Secret ``<kafka_secrets>-<role>``
  (``loader``, ``constructor``, ``autoscaler``), made by the operator, read-only at ``KAFKA_SECRETS_FOLDER``;
  the spec's ``kafka`` section refers to the files there. No credential is ever in a rendered object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from pipeline.spec import JobSpec
from topics.errors import MixflowError

Manifest = dict[str, Any]

METRICS_PORT = 9400
DESIRED_LOADERS_METRIC = "mixflow_autoscaler_desired_loaders"
# The Kubernetes label a StatefulSet controller puts on each pod with its ordinal (Kubernetes >= 1.28).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# StatefulSet names get "-<revision hash>" in a label value of at most 63 characters.
MAX_NAME_LENGTH = 52
SPEC_FOLDER = PurePosixPath("/etc/mixflow")
KAFKA_SECRETS_FOLDER = PurePosixPath("/var/run/secrets/mixflow-kafka")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""Every object of a job carries both: ``mixflow``, and the job's name as a Kubernetes name. Two jobs whose
names give the same Kubernetes name would clash in a cluster's namespace as they do here."""


@dataclass(frozen=True)
class DeployOptions:
    """What the spec does not say about the cluster."""

    image: str = "mixflow:latest"
    namespace: str = "default"
    bootstrap_servers: str | None = None  # None: the spec's kafka.bootstrap_servers
    data_claim: str | None = None  # a PersistentVolumeClaim with the sources' files; None: "<job>-data"
    data_mount: str = "/data"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    spec_file: str = "spec.yaml"
    kafka_secrets: str | None = None  # the prefix of each role's Secret of Kafka credentials; None: plaintext

    def __post_init__(self) -> None:
        if not PurePosixPath(self.data_mount).is_absolute() or PurePosixPath(self.data_mount) == SPEC_FOLDER:
            msg = f"--data-mount must be an absolute path other than {SPEC_FOLDER}, got {self.data_mount!r}"
            raise MixflowError(msg)
        if "/" in self.spec_file or not self.spec_file:
            msg = f"the spec's file name {self.spec_file!r} must be a plain file name"
            raise MixflowError(msg)

    @property
    def spec_path(self) -> str:
        return str(SPEC_FOLDER / self.spec_file)


def object_name(*parts: str) -> str:
    """A DNS-1123 name from job and source names (``[a-zA-Z0-9_-]``): lower case, ``_`` as ``-``."""
    name = "-".join(parts).lower().replace("_", "-").strip("-")
    if len(name) > MAX_NAME_LENGTH or not _DNS_LABEL.match(name):
        msg = (
            f"the Kubernetes name {name!r} (from {'/'.join(parts)}) is not a DNS label of at most "
            f"{MAX_NAME_LENGTH} characters; shorten the job or source name"
        )
        raise MixflowError(msg)
    return name


def labels(job: str, component: str, **extra: str) -> dict[str, str]:
    return {
        NAME_LABEL: "mixflow",
        INSTANCE_LABEL: object_name(job),
        "app.kubernetes.io/component": component,
        **extra,
    }


def render_job(spec: JobSpec, spec_text: str, options: DeployOptions = DeployOptions()) -> list[Manifest]:
    """Every object of the job, ConfigMap first."""
    job = spec.job
    names = {s.name: object_name(job, "load", s.name) for s in spec.sources}
    if len(set(names.values())) < len(names):
        msg = f"sources {sorted(names)} give clashing Kubernetes names {sorted(names.values())}; rename one"
        raise MixflowError(msg)
    objects = [config_map(spec, spec_text, options)]
    for source in spec.sources:
        objects += [loaders(spec, source.name, options), loaders_service(spec, source.name, options)]
    objects += [constructor(spec, lane, options) for lane in range(spec.constructor.lanes)]
    if spec.autoscaling.enabled:
        objects += [autoscaler(spec, options), autoscaler_service(spec, options)]
        objects += [scaled_object(spec, s.name, options) for s in spec.sources if s.autoscale is not None]
    return objects


def _metadata(spec: JobSpec, name: str, component: str, options: DeployOptions, **extra: str) -> Manifest:
    return {"name": name, "namespace": options.namespace, "labels": labels(spec.job, component, **extra)}


def spec_in_cluster(spec_text: str, data_mount: str) -> str:
    """The spec with its relative paths (sources' ``path`` and ``tokenizer``, the job's ``tokenizer``)
    made absolute under ``data_mount``; absolute paths are kept, so they must exist in the image."""
    document = yaml.safe_load(spec_text)

    def moved(value: object) -> object:
        if isinstance(value, str) and not PurePosixPath(value).is_absolute():
            return str(PurePosixPath(data_mount) / value)
        return value

    if "tokenizer" in document:
        document["tokenizer"] = moved(document["tokenizer"])
    for source in document.get("sources") or []:
        for key in ("path", "tokenizer"):
            if isinstance(source, dict) and key in source:
                source[key] = moved(source[key])
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def config_map(spec: JobSpec, spec_text: str, options: DeployOptions) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, object_name(spec.job, "spec"), "spec", options),
        "data": {options.spec_file: spec_in_cluster(spec_text, options.data_mount)},
    }


def kafka_secret_name(options: DeployOptions, component: str) -> str | None:
    """The Secret holding the Kafka credentials of a role's pods (``loader``, ...); None when there are none."""
    return object_name(options.kafka_secrets, component) if options.kafka_secrets else None


def _volumes(spec: JobSpec, options: DeployOptions, component: str) -> tuple[list[Manifest], list[Manifest]]:
    """The pod's volumes (the spec's ConfigMap, the data claim, the role's Kafka credentials on a secured
    cluster) and the container's mounts of them."""
    claim = options.data_claim or object_name(spec.job, "data")
    volumes = [
        {"name": "spec", "configMap": {"name": object_name(spec.job, "spec")}},
        {"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
    ]
    mounts = [
        {"name": "data", "mountPath": options.data_mount, "readOnly": True},
        {"name": "spec", "mountPath": str(SPEC_FOLDER), "readOnly": True},
    ]
    if secret := kafka_secret_name(options, component):
        volumes.append({"name": "kafka-credentials", "secret": {"secretName": secret, "defaultMode": 0o400}})
        mounts.append({"name": "kafka-credentials", "mountPath": str(KAFKA_SECRETS_FOLDER), "readOnly": True})
    return volumes, mounts


def _container(name: str, args: list[str], options: DeployOptions, mounts: list[Manifest], **extra: Any) -> Manifest:
    bootstrap = ["--bootstrap-servers", options.bootstrap_servers] if options.bootstrap_servers else []
    return {
        "name": name,
        "image": options.image,
        "args": [*args, "--spec", options.spec_path, *bootstrap, "--metrics-port", str(METRICS_PORT)],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "volumeMounts": mounts,
        **extra,
    }


def _pod_annotations() -> dict[str, str]:
    """For a Prometheus that discovers pods by annotation."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}


def loaders(spec: JobSpec, source: str, options: DeployOptions) -> Manifest:
    """The StatefulSet of ``source``'s loaders: ``--instance`` is the pod's ordinal."""
    name = object_name(spec.job, "load", source)
    selector = labels(spec.job, "loader", **{"mixflow.dev/source": object_name(source)})
    volumes, mounts = _volumes(spec, options, "loader")
    ordinal = {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}
    env = [{"name": "MIXFLOW_INSTANCE", "valueFrom": ordinal}]
    container = _container(
        "loader", ["load", "--source", source, "--instance", "$(MIXFLOW_INSTANCE)"], options, mounts, env=env
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, name, "loader", options, **{"mixflow.dev/source": object_name(source)}),
        "spec": {
            "serviceName": name,
            "replicas": spec.source(source).loaders,
            # Loaders need no order: all start at once, and instance 0 plans while the others wait for it.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(selector), "annotations": _pod_annotations()},
                "spec": {
                    # SIGTERM: a loader finishes its current units and leaves the group.
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def loaders_service(spec: JobSpec, source: str, options: DeployOptions) -> Manifest:
    """The headless Service a StatefulSet names: stable pod names in DNS, and a target to scrape."""
    name = object_name(spec.job, "load", source)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name, "loader", options, **{"mixflow.dev/source": object_name(source)}),
        "spec": {
            "clusterIP": "None",
            "selector": labels(spec.job, "loader", **{"mixflow.dev/source": object_name(source)}),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def constructor(spec: JobSpec, lane: int, options: DeployOptions) -> Manifest:
    """Two ``mixflow construct`` pods of one lane: the lease makes one active and the other its shadow."""
    name = object_name(spec.job, "construct", str(lane))
    selector = labels(spec.job, "constructor", **{"mixflow.dev/lane": str(lane)})
    volumes, mounts = _volumes(spec, options, "constructor")
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    args = ["construct", "--lane", str(lane), "--instance", "$(POD_NAME)"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, name, "constructor", options, **{"mixflow.dev/lane": str(lane)}),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": selector},
            # Replace one pod at a time, so a shadow is there to take over from the pod being replaced.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
            "template": {
                "metadata": {"labels": dict(selector), "annotations": _pod_annotations()},
                "spec": {
                    "containers": [_container("constructor", args, options, mounts, env=env)],
                    "volumes": volumes,
                },
            },
        },
    }


def autoscaler(spec: JobSpec, options: DeployOptions) -> Manifest:
    name = object_name(spec.job, "autoscale")
    selector = labels(spec.job, "autoscaler")
    volumes, mounts = _volumes(spec, options, "autoscaler")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, name, "autoscaler", options),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(selector), "annotations": _pod_annotations()},
                "spec": {"containers": [_container("autoscaler", ["autoscale"], options, mounts)], "volumes": volumes},
            },
        },
    }


def autoscaler_service(spec: JobSpec, options: DeployOptions) -> Manifest:
    """The autoscaler's metrics endpoint, for a Prometheus that scrapes services."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, object_name(spec.job, "autoscale"), "autoscaler", options),
        "spec": {
            "selector": labels(spec.job, "autoscaler"),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def desired_loaders_query(job: str, source: str) -> str:
    """The autoscaler's gauge for one source. Prometheus renames a scraped ``job`` label to ``exported_job``
    unless the scrape honours labels, so either spelling matches."""
    return " or ".join(
        f'max({DESIRED_LOADERS_METRIC}{{{job_label}="{job}",source="{source}"}})'
        for job_label in ("job", "exported_job")
    )


def scaled_object(spec: JobSpec, source: str, options: DeployOptions) -> Manifest:
    """KEDA scales the source's StatefulSet to the autoscaler's desired loaders (threshold 1 per replica)."""
    fewest, most = spec.source(source).loader_bounds()
    target = object_name(spec.job, "load", source)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _metadata(spec, target, "loader", options),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": target},
            # At least one: ordinal 0 plans the source (and the epochs asked for later).
            "minReplicaCount": max(1, fewest),
            "maxReplicaCount": most,
            "pollingInterval": 15,
            # The autoscaler has its own hysteresis; the HPA need not wait another 5 minutes to scale down.
            "advanced": {
                "horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": options.prometheus_url,
                        "query": desired_loaders_query(spec.job, source),
                        "threshold": "1",
                    },
                }
            ],
        },
    }
