"""`mixflow control set-mixture`: change a running job's mixture from a given step on."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from confluent_kafka import Message

from pipeline.cli.command import Command
from pipeline.kafka.clients import KafkaConfig
from pipeline.kafka.control import (
    change_answer,
    first_changeable_step,
    lanes_finished,
    new_change_id,
    publish_mixture_change,
    shares_from_arguments,
)
from pipeline.kafka.state_topic import STATE_TAIL
from pipeline.planning.mixing import MixtureChange, refusal
from pipeline.planning.step.state import ConstructorState
from pipeline.spec import load_spec
from topics.admin import topic_exists
from topics.errors import DecodeError, MixflowError
from topics.log_reader import read_to_end
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
    states = read_lane_states(config, topics, spec.constructor.lanes)
    if lanes_finished(states):
        steps = first_changeable_step(states)  # one past the highest step written
        msg = f"job {topics.job} finished at step {steps}; there is no later step to change"
        raise MixflowError(msg)
    first = first_changeable_step(states)
    if reason := refusal(change, first, spec.source_names):
        if len(states) > 1 and change.from_step < first:
            reason = f"a constructor lane is past step {change.from_step} (every lane can change step {first} on)"
        msg = f"cannot change the mixture of {topics.job} from step {args.from_step}: {reason}"
        raise MixflowError(msg)
    offset = publish_mixture_change(config, topics, change)
    outcome = {"job": topics.job, "change": change.id, "from_step": change.from_step, "shares": shares}
    outcome["status"] = _wait_for_answer(config, topics, change.id, args.wait_s, spec.constructor.lanes)
    print(json.dumps({**outcome, "control_offset": offset}))
    if outcome["status"] == "refused":
        print(
            f"mixflow control: the constructor refused change {change.id}: it had gone past step {change.from_step} "
            "before it read the change; publish it again with a later --from-step",
        )
        return 1
    return 0


def read_lane_states(config: KafkaConfig, topics: JobTopics, lanes: int) -> list[ConstructorState | None]:
    """The last committed state of each of the job's ``lanes`` constructor lanes (None: none yet)."""
    last: dict[int, Message] = {}
    for record in read_to_end(config, topics.state, tail=STATE_TAIL):
        last[record.partition()] = record  # in offset order: the last of each partition wins
    states: list[ConstructorState | None] = []
    for lane in range(lanes):
        record = last.get(lane)
        try:
            states.append(ConstructorState.from_bytes(record.value()) if record is not None else None)
        except DecodeError as exc:
            raise exc.at(record.topic(), record.partition(), record.offset()) from exc
    return states


def _wait_for_answer(config: KafkaConfig, topics: JobTopics, change_id: str, wait_s: float, lanes: int = 1) -> str:
    """``accepted`` once every lane's state record says so, ``refused`` once one says that, ``published``
    if neither happened in ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if answer := change_answer(read_lane_states(config, topics, lanes), change_id):
            return answer
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
