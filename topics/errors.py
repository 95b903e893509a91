"""The error types every mixflow package raises for problems a user can cause."""

from __future__ import annotations

from typing import Protocol

STUCK_CLIENT_EXIT = 3
"""The exit code of a role whose Kafka client got stuck (librdkafka#5456): it asks to be started again, as
``mixflow run`` and the chaos supervisor do."""


class MixflowError(Exception):
    """Base class: a problem with input, configuration or the environment, with a message that says
    what and where. The CLI prints it without a traceback and exits with the class's ``exit_code``: 2
    here, a bad argument or spec, as for argparse's own usage errors; the subclasses below say which
    other kind of problem it is."""

    exit_code = 2


class NotFoundError(MixflowError):
    """What a user named does not exist: a file or folder, a job, a topic, a source, a rank."""

    exit_code = 4


class RefusedError(MixflowError):
    """A request refused: it would overwrite or delete what does not belong to the job, or the job's
    state does not allow it (running, finished, a step written already)."""

    exit_code = 5


class SecurityRefusedError(RefusedError):
    """A secured cluster refused the client: its credentials (a wrong password, an unknown user, none), or
    the TLS handshake (a broker certificate from another CA, for another host, or expired)."""


class BrokerUnreachableError(MixflowError):
    """No Kafka broker answered at the bootstrap servers."""

    exit_code = 6


class NoAnswerError(MixflowError):
    """A request was made and nobody answered it in time (a running job's constructor, say)."""

    exit_code = 7


class InvalidNameError(MixflowError, ValueError):
    """A job, source or topic name that Kafka cannot hold."""


class TopicLayoutError(MixflowError):
    """A topic exists with a different partition count or configuration than the job needs."""


class DecodeError(MixflowError):
    """A record that cannot be decoded: truncated, corrupt, or written under an unknown format.

    ``topic``, ``partition`` and ``offset`` are set when the record came from Kafka."""

    def __init__(
        self,
        reason: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(self._message())

    def _message(self) -> str:
        where = [
            f"{name}={value}"
            for name, value in (("topic", self.topic), ("partition", self.partition), ("offset", self.offset))
            if value is not None
        ]
        return (
            f"cannot decode record ({', '.join(where)}): {self.reason}"
            if where
            else (f"cannot decode record: {self.reason}")
        )

    def at(self, topic: str, partition: int, offset: int) -> DecodeError:
        """The same error, located at a Kafka record."""
        return DecodeError(self.reason, topic=topic, partition=partition, offset=offset)

    @classmethod
    def of_record(cls, reason: str, record: Located) -> DecodeError:
        """The error ``reason`` about ``record`` (a Kafka message), located at its topic, partition and offset."""
        return cls(reason, topic=record.topic(), partition=record.partition(), offset=record.offset())


class Located(Protocol):
    """A record that says where it was read (a Kafka message)."""

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...
