"""The error types every mixflow package raises for problems a user can cause."""


class MixflowError(Exception):
    """Base class: a problem with input, configuration or the environment, with a message that says
    what and where. The CLI prints it without a traceback."""


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

    def at(self, topic: str, partition: int, offset: int) -> "DecodeError":
        """The same error, located at a Kafka record."""
        return DecodeError(self.reason, topic=topic, partition=partition, offset=offset)
