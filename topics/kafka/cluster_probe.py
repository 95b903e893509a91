"""Whether a Kafka cluster answers, and what a job has there: asked once, before a command or a trainer's
sink starts its work, so that a wrong address, job name or rank is said at once and in one line.

librdkafka logs every failed connection attempt (a ``FAIL`` line every few hundred milliseconds while no
broker answers); the probe counts those lines instead of printing them, and its error says how many there
were and gives the last error. A secured cluster's refusal (authentication, or a TLS handshake the client
cannot complete) is said as such: which listener, and what is wrong (``topics/kafka/client_refusals.py``).
The probe is a consumer that joins nothing: asking it about a topic that does not exist never creates one,
whatever the brokers' ``auto.create.topics.enable``."""

from __future__ import annotations

import difflib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from topics.errors import BrokerUnreachableError, MixflowError, NotFoundError, SecurityRefusedError
from topics.formats.names import JobTopics, TopicKind, parse_topic
from topics.kafka.admin_client import bootstrap_servers, client_config
from topics.kafka.authorization import is_authorization_error, refused
from topics.kafka.client_refusals import certificate_problem, is_certificate_refusal, listener_of, refusal
from topics.kafka.librdkafka_log import is_benign

DEFAULT_TIMEOUT_S = 15.0
GIVE_UP_AFTER_S = 2.0
"""How long every broker may refuse connections (or have a name that does not resolve) before the probe
says the cluster is not there, rather than waiting for the whole timeout."""
_ASK_EVERY_S = 0.5
# librdkafka's errors that mean no broker could be reached at all (not a broker that is slow to answer).
_NOT_THERE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    }
)


class LibrdkafkaLog(logging.Handler):
    """Takes a librdkafka client's log lines (its ``logger`` setting) and keeps only their count and the last,
    handing each to ``on_line`` when given."""

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        super().__init__(logging.DEBUG)
        self.lines = 0
        self.last: str | None = None
        self.on_line = on_line

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1
        self.last = record.getMessage()
        if self.on_line is not None:
            self.on_line(self.last)

    def logger(self) -> logging.Logger:
        """A logger of its own (not registered with ``logging``) that hands every line to this handler."""
        logger = logging.Logger("mixflow.kafka.probe", logging.DEBUG)
        logger.addHandler(self)
        return logger


class ClusterProbe:
    """Asks a cluster for its topics, or one topic; ``BrokerUnreachableError`` when no broker answers: after
    ``give_up_after_s`` when every connection attempt fails (refused, a name that does not resolve), else after
    ``timeout_s``; ``SecurityRefusedError`` instead when a secured listener refused the client's credentials or
    TLS."""

    def __init__(
        self,
        bootstrap_or_config: str | Mapping[str, Any],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        give_up_after_s: float = GIVE_UP_AFTER_S,
    ) -> None:
        try:
            config = client_config(bootstrap_or_config)
        except ValueError as exc:
            raise MixflowError(str(exc)) from exc
        self.servers = bootstrap_servers(config)
        self.timeout_s = timeout_s
        self.give_up_after_s = give_up_after_s
        self._config = config
        self._log = LibrdkafkaLog(self._note)
        self._unreachable_since: float | None = None
        self._last_error: KafkaError | None = None
        self._refused: str | None = None  # the last librdkafka line that says a secured listener refused us
        self._refused_since: float | None = None
        settings = {
            **config,
            "group.id": f"mixflow-probe-{uuid.uuid4().hex[:12]}",  # required; never joined
            "enable.auto.commit": False,
            "logger": self._log.logger(),
            "error_cb": self._on_error,
        }
        try:
            self._client = Consumer(settings)
        except KafkaException as exc:
            msg = f"bad Kafka client settings for {self.servers}: {exc.args[0]}"
            raise MixflowError(msg) from exc

    def __enter__(self) -> ClusterProbe:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def topics(self, topic: str | None = None, doing: str = "asking for its metadata") -> dict[str, int]:
        """Every topic on the cluster (or only ``topic``, if it exists) and its partition count; ``doing``: what
        a refusal to describe ``topic`` says was being done."""
        began = time.monotonic()
        while True:
            try:
                metadata = self._client.list_topics(topic, timeout=_ASK_EVERY_S)
            except KafkaException:
                self._client.poll(0)  # serves the error and log callbacks
                if self._gave_up(began):
                    raise self._unreachable(time.monotonic() - began) from None
                continue
            asked = metadata.topics.get(topic) if topic is not None else None
            if asked is not None and is_authorization_error(asked.error):
                raise refused(self._config, "DESCRIBE", "topic", topic or "", doing)
            return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def _on_error(self, error: KafkaError) -> None:
        self._last_error = error
        self._note(error.str())
        if error.code() in _NOT_THERE and self._unreachable_since is None:
            self._unreachable_since = time.monotonic()

    def _note(self, line: str) -> None:
        if not is_benign(line) and refusal(self._config, line) is not None:
            self._refused = line
            self._refused_since = self._refused_since or time.monotonic()

    def _gave_up(self, began: float) -> bool:
        now = time.monotonic()
        since, refused = self._unreachable_since, self._refused_since
        # A refusal is an answer: given up on after GIVE_UP_AFTER_S even where unreachability is waited out.
        if refused is not None and now - refused >= min(self.give_up_after_s, GIVE_UP_AFTER_S):
            return True
        return now - began >= self.timeout_s or (since is not None and now - since >= self.give_up_after_s)

    def _unreachable(self, seconds: float) -> BrokerUnreachableError | SecurityRefusedError:
        if self._refused is not None:
            listener = listener_of(self._refused) or self.servers
            verify = None
            if is_certificate_refusal(self._refused):
                verify = certificate_problem(listener, self._config.get("ssl.ca.location"))
            reason = refusal(self._config, self._refused, verify)
            msg = f"Kafka at {self.servers} refused this client (listener {listener}): {reason}"
            return SecurityRefusedError(msg)
        error = self._last_error.str() if self._last_error is not None else self._log.last or "no answer"
        msg = (
            f"no Kafka broker answers at {self.servers} ({seconds:.1f} s; librdkafka logged {self._log.lines} "
            f"lines, the last error: {error}): is the broker running (mixflow stack status), and is the address "
            "right (--bootstrap-servers, $KAFKA_BOOTSTRAP_SERVERS, the spec's kafka.bootstrap_servers)?"
        )
        return BrokerUnreachableError(msg)


def cluster_topics(bootstrap_or_config: str | Mapping[str, Any], **probe: float) -> dict[str, int]:
    """Every topic on the cluster and its partition count (``ClusterProbe``'s errors, ``probe`` its options)."""
    with ClusterProbe(bootstrap_or_config, **probe) as asking:
        return asking.topics()


@dataclass(frozen=True)
class JobOnCluster:
    """What a cluster holds of one job: its topics (name and partitions), and the other jobs there."""

    job: str
    servers: str
    topics: Mapping[str, int]
    jobs: frozenset[str]

    @property
    def ranks(self) -> int:
        """The job's rank topics: ``<job>.rank.0`` up to this, not included (every role creates them together)."""
        return sum(parse_topic(name).kind is TopicKind.RANK for name in self.topics)

    def require(self) -> JobOnCluster:
        """Itself; ``NotFoundError`` naming the jobs with the closest names when the job has no topic there."""
        if self.topics:
            return self
        close = difflib.get_close_matches(self.job, sorted(self.jobs), n=3, cutoff=0.6)
        hint = f"; jobs with a name like it: {', '.join(close)}" if close else f"; {len(self.jobs)} other jobs there"
        msg = (
            f"job {self.job!r} does not exist at {self.servers} (no topic of it there): it has not started, or "
            f"its name is wrong{hint}"
        )
        raise NotFoundError(msg)

    def require_rank(self, rank: int) -> None:
        """``NotFoundError`` when the job's rank topics are there and ``rank`` is not one of them."""
        ranks = self.ranks
        if ranks and not 0 <= rank < ranks:
            msg = (
                f"job {self.job!r} has {ranks} ranks at {self.servers} (topics {self.job}.rank.0 to "
                f"{self.job}.rank.{ranks - 1}): there is no rank {rank}"
            )
            raise NotFoundError(msg)


def require_reachable(bootstrap_or_config: str | Mapping[str, Any], topic: str) -> None:
    """Nothing once a broker answers a metadata request of ``topic`` (one topic, whether it exists or not: what
    thousands of roles starting together can afford). Before a role starts: a secured cluster that refuses its
    credentials or TLS is said at once (``SecurityRefusedError``), while a broker that does not answer (one
    restarting) is waited for the whole timeout, as the role's own clients would."""
    with ClusterProbe(bootstrap_or_config, give_up_after_s=DEFAULT_TIMEOUT_S) as asking:
        asking.topics(topic)


def job_on_cluster(bootstrap_or_config: str | Mapping[str, Any], job: str, **probe: float) -> JobOnCluster:
    """``job``'s topics on the cluster (``ClusterProbe``'s errors, ``probe`` its options).

    A secured cluster lists only the topics the principal may describe, so a job the principal may not see
    lists as empty, as one that does not exist does. When none of the job's topics lists, its control topic is
    asked for by name: a principal refused to describe it is told so (``AuthorizationError``, exit 5), rather
    than that the job does not exist; whether it exists is not said, as Kafka does not say."""
    with ClusterProbe(bootstrap_or_config, **probe) as asking:
        found = _job_in(job, asking.servers, asking.topics())
        if not found.topics:
            asking.topics(
                JobTopics(job).control,
                doing=f"asking whether job {job} exists; Kafka does not say if a topic it may not describe does",
            )
        return found


def require_rank_topic(bootstrap_or_config: str | Mapping[str, Any], job: str, rank: int, **probe: float) -> None:
    """Nothing when ``<job>.rank.<rank>`` exists (asked for alone: one metadata request of one topic, which
    thousands of sinks starting together can afford); ``NotFoundError`` when the job does not exist, or has
    rank topics and not this one; ``BrokerUnreachableError`` when no broker answers."""
    topics = JobTopics(job)
    with ClusterProbe(bootstrap_or_config, **probe) as asking:
        if topics.rank(rank) in asking.topics(topics.rank(rank)):
            return
        found = _job_in(job, asking.servers, asking.topics())  # only when something is wrong: every topic
    found.require().require_rank(rank)


def _job_in(job: str, servers: str, found: Mapping[str, int]) -> JobOnCluster:
    topics: dict[str, int] = {}
    jobs: set[str] = set()
    for name, partitions in found.items():
        try:
            topic = parse_topic(name)
        except MixflowError:
            continue  # not a mixflow topic
        jobs.add(topic.job)
        if topic.job == job:
            topics[name] = partitions
    return JobOnCluster(JobTopics(job).job, servers, topics, frozenset(jobs - {job}))
