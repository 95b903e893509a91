"""`mixflow control set-mixture`: change a running job's mixture from a given step on."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.cli.arguments import job_name, non_negative_float, non_negative_int
from pipeline.cli.command import Command
from pipeline.kafka.control import (
    change_answer,
    first_changeable_step,
    lanes_finished,
    new_change_id,
    publish_mixture_change,
    shares_from_arguments,
)
from pipeline.kafka.state_topic import read_lane_states
from pipeline.planning.mixing import MixtureChange, refusal
from pipeline.spec import load_spec
from topics.errors import NoAnswerError, NotFoundError, RefusedError
from topics.formats.names import JobTopics
from topics.kafka.clients import KafkaConfig
from topics.kafka.cluster_probe import job_on_cluster

SAY_EVERY_S = 5.0


def _add_set_mixture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument(
        "--job", type=job_name, help="the job whose steps change, if not the spec's (a job written with --output-job)"
    )
    parser.add_argument(
        "--from-step", type=non_negative_int, required=True, help="the first step with the new shares (0 or more)"
    )
    parser.add_argument(
        "--wait-s",
        type=non_negative_float,
        default=60.0,
        help="seconds to wait for the constructor to accept or refuse it, saying every few seconds what it waits "
        "for; exits 7 if none answered; 0: do not wait (default: %(default)s)",
    )
    parser.add_argument("shares", nargs="+", metavar="SOURCE=SHARE", help="new shares; sources not named get 0")


def _set_mixture(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers, role="operator")
    topics = JobTopics(args.job or spec.job)
    _require_sources(args.shares, spec.source_names)
    shares = shares_from_arguments(args.shares, dict.fromkeys(spec.source_names))
    change = MixtureChange(new_change_id(), args.from_step, shares)
    if topics.control not in job_on_cluster(config, topics.job).require().topics:
        msg = f"job {topics.job} does not exist yet (no topic {topics.control}); change its spec before it starts"
        raise NotFoundError(msg)
    states = read_lane_states(config, topics, spec.constructor.lanes)
    if lanes_finished(states):
        steps = first_changeable_step(states)  # one past the highest step written
        msg = f"job {topics.job} finished at step {steps}; there is no later step to change"
        raise RefusedError(msg)
    first = first_changeable_step(states)
    if reason := refusal(change, first, spec.source_names):
        if len(states) > 1 and change.from_step < first:
            reason = f"a constructor lane is past step {change.from_step} (every lane can change step {first} on)"
        msg = f"cannot change the mixture of {topics.job} from step {args.from_step}: {reason}"
        raise RefusedError(msg)
    offset = publish_mixture_change(config, topics, change)
    outcome = {"job": topics.job, "change": change.id, "from_step": change.from_step, "shares": shares}
    outcome["status"] = _wait_for_answer(config, topics, change.id, args.wait_s, spec.constructor.lanes, _say)
    print(json.dumps({**outcome, "control_offset": offset}))
    if outcome["status"] == "refused":
        msg = (
            f"the constructor refused change {change.id}: it had gone past step {change.from_step} before it read "
            "the change; publish it again with a later --from-step"
        )
        raise RefusedError(msg)
    if outcome["status"] == "published" and args.wait_s > 0:
        msg = (
            f"no constructor of job {topics.job} answered change {change.id} within {args.wait_s:g} s: it is "
            f"published, and a constructor that reads it before writing step {change.from_step} applies it "
            "(mixflow top shows the mixture in force)"
        )
        raise NoAnswerError(msg)
    return 0


def _require_sources(pairs: list[str], sources: Sequence[str]) -> None:
    for pair in pairs:
        name, sep, _ = pair.partition("=")
        if sep and name not in sources:
            msg = f"{pair!r}: the job mixes no source {name!r} (it mixes {', '.join(sources)})"
            raise NotFoundError(msg)


def _say(line: str) -> None:
    print(f"mixflow control: {line}", file=sys.stderr, flush=True)


def _wait_for_answer(
    config: KafkaConfig,
    topics: JobTopics,
    change_id: str,
    wait_s: float,
    lanes: int = 1,
    say: Callable[[str], None] | None = None,
) -> str:
    """``accepted`` once every lane's state record says so, ``refused`` once one says that, ``published``
    if neither happened in ``wait_s``; ``say`` hears every few seconds what it waits for."""
    began = time.monotonic()
    said = began
    while (waited := time.monotonic() - began) < wait_s:
        states = read_lane_states(config, topics, lanes)
        if answer := change_answer(states, change_id):
            return answer
        if say is not None and time.monotonic() - said >= SAY_EVERY_S:
            written = first_changeable_step(states)
            say(
                f"waiting for the constructor of {topics.job} to read change {change_id} ({waited:.0f} s of "
                f"{wait_s:g} s; steps written so far: {written})"
            )
            said = time.monotonic()
        time.sleep(0.5)  # polling another process's progress on the state topic
    return "published"


ACTIONS = (
    Command(
        name="set-mixture",
        help="publish new mixture shares from step K on; the constructor accepts them if it has not written K",
        add_arguments=_add_set_mixture_arguments,
        run=_set_mixture,
    ),
)
