"""Checks that a job's rendered objects refer to each other correctly: what a schema cannot see.

Selectors match their pods' labels, every mount names a volume of its pod, the spec's ConfigMap is
mounted where each command reads ``--spec``, loaders get their ordinal as ``--instance``, and each
ScaledObject targets its source's StatefulSet with a query for that source's desired loaders.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any

from pipeline.tools.deploy.manifests import DESIRED_LOADERS_METRIC, POD_INDEX_LABEL, Manifest

WORKLOADS = ("Deployment", "StatefulSet")


def _where(obj: Manifest) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}"


def _argument(args: Sequence[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def _covers(selector: dict[str, str], pod_labels: dict[str, str]) -> bool:
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def check_links(objects: Sequence[Manifest]) -> list[str]:
    """Every broken reference among ``objects``, as a sentence naming the object; empty when all hold."""
    by_kind: dict[str, dict[str, Manifest]] = {}
    problems: list[str] = []
    for obj in objects:
        named = by_kind.setdefault(obj["kind"], {})
        if obj["metadata"]["name"] in named:
            problems.append(f"{_where(obj)} is rendered twice")
        named[obj["metadata"]["name"]] = obj
    namespaces = {obj["metadata"].get("namespace") for obj in objects}
    if len(namespaces) != 1:
        problems.append(f"objects are spread over namespaces {sorted(map(str, namespaces))}")
    for kind in WORKLOADS:
        for workload in by_kind.get(kind, {}).values():
            problems += _workload_problems(workload, by_kind)
    for service in by_kind.get("Service", {}).values():
        problems += _service_problems(service, by_kind)
    for scaled in by_kind.get("ScaledObject", {}).values():
        problems += _scaled_object_problems(scaled, by_kind)
    return problems


def _containers(workload: Manifest) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def _workload_problems(workload: Manifest, by_kind: dict[str, dict[str, Manifest]]) -> Iterator[str]:
    where = _where(workload)
    template = workload["spec"]["template"]
    if not _covers(workload["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]):
        yield f"{where}: its selector does not match its pod template's labels"
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    for container in _containers(workload):
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        for mount in mounts.values():
            if mount["name"] not in volumes:
                yield f"{where}: container {container['name']} mounts volume {mount['name']}, which the pod lacks"
        yield from _spec_mount_problems(where, container, mounts, volumes, by_kind)
        if workload["kind"] == "StatefulSet":
            yield from _instance_problems(where, container)
    if workload["kind"] == "StatefulSet":
        service = by_kind.get("Service", {}).get(workload["spec"]["serviceName"])
        if service is None or service["spec"].get("clusterIP") != "None":
            yield f"{where}: its serviceName {workload['spec']['serviceName']} is not a headless Service"


def _spec_mount_problems(
    where: str, container: dict[str, Any], mounts: dict[str, Any], volumes: dict[str, Any], by_kind: dict
) -> Iterator[str]:
    spec_path = PurePosixPath(_argument(container["args"], "--spec") or "")
    mount = mounts.get(str(spec_path.parent))
    if mount is None:
        yield f"{where}: container {container['name']} reads --spec {spec_path}, where nothing is mounted"
        return
    config_map = volumes.get(mount["name"], {}).get("configMap", {}).get("name")
    data = by_kind.get("ConfigMap", {}).get(config_map, {}).get("data", {})
    if spec_path.name not in data:
        yield f"{where}: --spec {spec_path} is not a key of a rendered ConfigMap (volume {mount['name']})"


def _instance_problems(where: str, container: dict[str, Any]) -> Iterator[str]:
    instance = _argument(container["args"], "--instance") or ""
    env = {e["name"]: e for e in container.get("env", [])}
    variable = instance.removeprefix("$(").removesuffix(")")
    path = env.get(variable, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if path != f"metadata.labels['{POD_INDEX_LABEL}']":
        yield f"{where}: --instance {instance} is not the pod's ordinal ({POD_INDEX_LABEL})"


def _service_problems(service: Manifest, by_kind: dict[str, dict[str, Manifest]]) -> Iterator[str]:
    pods = [w for kind in WORKLOADS for w in by_kind.get(kind, {}).values()]
    selected = [w for w in pods if _covers(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
    if not selected:
        yield f"{_where(service)}: its selector matches no rendered pods"
    for port in service["spec"]["ports"]:
        for workload in selected:
            names = {p.get("name") for c in _containers(workload) for p in c.get("ports", [])}
            if port["targetPort"] not in names:
                yield f"{_where(service)}: targetPort {port['targetPort']} is no port of {_where(workload)}"


def _scaled_object_problems(scaled: Manifest, by_kind: dict[str, dict[str, Manifest]]) -> Iterator[str]:
    where = _where(scaled)
    ref = scaled["spec"]["scaleTargetRef"]
    target = by_kind.get(ref.get("kind", "Deployment"), {}).get(ref["name"])
    if target is None:
        yield f"{where}: it scales {ref.get('kind')} {ref['name']}, which is not rendered"
        return
    source = _argument(_containers(target)[0]["args"], "--source")
    job = _argument(_containers(target)[0]["args"], "--spec")  # only to say which; the query names the job
    if scaled["spec"]["minReplicaCount"] < 1:
        yield f"{where}: minReplicaCount below 1 would stop the source's planner (ordinal 0)"
    if scaled["spec"]["minReplicaCount"] > scaled["spec"]["maxReplicaCount"]:
        yield f"{where}: minReplicaCount is above maxReplicaCount"
    for trigger in scaled["spec"]["triggers"]:
        query = trigger["metadata"].get("query", "")
        if trigger["type"] != "prometheus" or DESIRED_LOADERS_METRIC not in query:
            yield f"{where}: trigger {trigger['type']} does not query {DESIRED_LOADERS_METRIC}"
        elif f'source="{source}"' not in query:
            yield f"{where}: its query {query!r} is not for source {source} of {ref['name']} ({job})"
