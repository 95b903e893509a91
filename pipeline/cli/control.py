"""`mixflow control set-mixture`: change a running job's mixture from a given step on."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeline.cli.command import Command
from pipeline.constructor.state_topic import read_last_state
from pipeline.control import new_change_id, publish_mixture_change, shares_from_arguments
from pipeline.mixing import MixtureChange, refusal
from pipeline.spec import load_spec
from topics.admin import topic_exists
from topics.errors import MixflowError
from topics.names import JobTopics


def _add_set_mixture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument("--job", help="the job whose steps change, if not the spec's (a job written with --output-job)")
    parser.add_argument("--from-step", type=int, required=True, help="the first step with the new shares")
    parser.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="seconds to wait for the constructor to accept or refuse it; 0: do not wait (default: %(default)s)",
    )
    parser.add_argument("shares", nargs="+", metavar="SOURCE=SHARE", help="new shares; sources not named get 0")


def _set_mixture(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers)
    topics = JobTopics(args.job or spec.job)
    shares = shares_from_arguments(args.shares, dict.fromkeys(spec.source_names))
    change = MixtureChange(new_change_id(), args.from_step, shares)
    if not topic_exists(config, topics.control):
        msg = f"job {topics.job} does not exist yet (no topic {topics.control}); change its spec before it starts"
        raise MixflowError(msg)
    state = read_last_state(config, topics)
    next_step = state.step if state is not None else 0
    if state is not None and state.finished:
        msg = f"job {topics.job} finished at step {state.step}; there is no later step to change"
        raise MixflowError(msg)
    if reason := refusal(change, next_step, spec.source_names):
        msg = f"cannot change the mixture of {topics.job} from step {args.from_step}: {reason}"
        raise MixflowError(msg)
    offset = publish_mixture_change(config, topics, change)
    outcome = {"job": topics.job, "change": change.id, "from_step": change.from_step, "shares": shares}
    outcome["status"] = _wait_for_answer(config, topics, change.id, args.wait_s)
    print(json.dumps({**outcome, "control_offset": offset}))
    if outcome["status"] == "refused":
        print(
            f"mixflow control: the constructor refused change {change.id}: it had written step {change.from_step} "
            "before it read the change; publish it again with a later --from-step",
        )
        return 1
    return 0


def _wait_for_answer(config: dict, topics: JobTopics, change_id: str, wait_s: float) -> str:
    """``accepted`` or ``refused`` once a state record says so, ``published`` if none did in ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = read_last_state(config, topics)
        if state is not None:
            if any(c.id == change_id for c in state.changes):
                return "accepted"
            if change_id in state.refused:
                return "refused"
        time.sleep(0.5)  # polling another process's progress on the state topic
    return "published"


COMMAND = Command(
    name="control",
    help="change a running job: its mixture from a given step on",
    actions=(
        Command(
            name="set-mixture",
            help="publish new mixture shares from step K on; the constructor accepts them if it has not written K",
            add_arguments=_add_set_mixture_arguments,
            run=_set_mixture,
        ),
    ),
)
