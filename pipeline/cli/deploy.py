"""`mixflow deploy render --spec SPEC --out DIR`: the job's Kubernetes manifests, one file per object."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.cli.arguments import output_folder
from pipeline.cli.command import Command
from pipeline.spec import load_spec
from pipeline.tools.deploy import DeployOptions, check_links, render_job, write_manifests
from pipeline.tools.deploy.manifests import KAFKA_SECRETS_FOLDER
from topics.errors import MixflowError

_DEFAULTS = DeployOptions()


def _add_render_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument(
        "--out",
        type=output_folder,
        required=True,
        help="folder for the manifests (kubectl apply -f OUT); files of the same job that a former rendering left "
        "there are replaced or removed, any other file is kept (and one in the way is refused)",
    )
    parser.add_argument("--image", default=_DEFAULTS.image, help="the mixflow image (default: %(default)s)")
    parser.add_argument("--namespace", default=_DEFAULTS.namespace, help="namespace (default: %(default)s)")
    parser.add_argument("--bootstrap-servers", help="Kafka in the cluster (default: the spec's kafka section)")
    parser.add_argument(
        "--data-claim", help="PersistentVolumeClaim holding the sources' files and tokenizers (default: JOB-data)"
    )
    parser.add_argument(
        "--data-mount",
        default=_DEFAULTS.data_mount,
        help="where the claim is mounted; the spec goes beside it, so its relative paths resolve there "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--kafka-secrets",
        metavar="PREFIX",
        help="a secured cluster: each role's pods mount the Secret PREFIX-loader, PREFIX-constructor or "
        "PREFIX-autoscaler (its credentials and CA, made with kubectl create secret) read-only at "
        f"{KAFKA_SECRETS_FOLDER}, where the spec's kafka section refers to them",
    )
    parser.add_argument(
        "--prometheus-url",
        default=_DEFAULTS.prometheus_url,
        help="the Prometheus KEDA asks for the desired loaders (default: %(default)s)",
    )


def _render(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    options = DeployOptions(
        image=args.image,
        namespace=args.namespace,
        bootstrap_servers=args.bootstrap_servers,
        data_claim=args.data_claim,
        data_mount=args.data_mount,
        prometheus_url=args.prometheus_url,
        spec_file=args.spec.name,
        kafka_secrets=args.kafka_secrets,
    )
    objects = render_job(spec, args.spec.read_text(encoding="utf-8"), options)
    if problems := check_links(objects):
        msg = "the rendered objects do not fit together:\n  " + "\n  ".join(problems)
        raise MixflowError(msg)
    done = write_manifests(objects, args.out)
    print(f"wrote {len(done.written)} objects of job {spec.job} to {args.out}", file=sys.stderr)
    for path in done.removed:
        print(f"removed {path}: an object of job {spec.job} this rendering no longer has", file=sys.stderr)
    for path in done.written:
        print(path)
    return 0


ACTIONS = (
    Command(
        name="render",
        help="write the job's ConfigMap, loaders, constructors, autoscaler and KEDA ScaledObjects to a folder",
        add_arguments=_add_render_arguments,
        run=_render,
    ),
)
