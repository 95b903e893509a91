"""librdkafka's log lines of mixflow's consumers, printed as librdkafka prints them, less the ones known to be
benign: those of a consumer's group coordinator connection that the consumer itself tore down.

Every consumer with a ``group.id`` (confluent-kafka requires one, even of a consumer that only assigns) connects
to its group's coordinator as soon as it is made. A consumer closed a moment later (a probe, a read to the end
of a topic) drops that connection, and on a secured listener it is often still in its TLS handshake or its SASL
login then; librdkafka logs that as an error of its ``GroupCoordinator`` connection:

- ``SASL authentication error: SaslAuthenticateRequest failed: Local: Broker transport failure (after 0ms in
  state DOWN)`` (or ``SASL SCRAM-SHA-512 mechanism handshake failed: Local: Broker transport failure``): the
  login's answer never came, as the client had closed the connection itself;
- ``error:0A00013F:SSL routines::ssl3 ext invalid servername (after 0ms in state SSL_HANDSHAKE)``: the connection
  was started again after the coordinator's address was cleared, with an empty server name.

Neither is a refusal, nor reaches any request; on a plaintext listener there is no such moment. A wrong
password, a certificate refused or a broker that is down are logged as any other line.

``LOGGER`` is the ``logger`` setting that routes a client's lines here (``logged``); it prints them to stderr
in librdkafka's own format, whatever the application's logging configuration, as librdkafka would have."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

LOGGER_NAME = "mixflow.librdkafka"
_COORDINATOR = "[thrd:GroupCoordinator]: GroupCoordinator: "
_BENIGN = (
    re.compile(r"Local: Broker transport failure.*\(after \d+ms in state DOWN"),
    re.compile(r"ssl3 ext invalid servername"),
)
_SYSLOG_LEVELS = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def is_benign(line: str) -> bool:
    """Whether a librdkafka log line (``FAC [client] [thrd:...]: ...``, or its message alone) is one of the
    group coordinator's teardown lines described above."""
    _, coordinator, said = line.partition(_COORDINATOR)
    return bool(coordinator) and any(pattern.search(said) for pattern in _BENIGN)


class _DropBenign(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if is_benign(record.getMessage()):
            self.dropped += 1
            return False
        return True


class _LibrdkafkaFormat(logging.Formatter):
    """``%3|1795939899.895|FAIL|rdkafka#consumer-7| [thrd:...]: ...``: the line librdkafka writes to stderr
    (confluent-kafka hands it over as ``"%s [%s] %s" % (facility, client, message)``)."""

    def format(self, record: logging.LogRecord) -> str:
        level = _SYSLOG_LEVELS.get(record.levelno, 7)
        if isinstance(record.args, tuple) and len(record.args) == 3:
            facility, client, message = record.args
            return f"%{level}|{record.created:.3f}|{facility}|{client}| {message}"
        return f"%{level}|{record.created:.3f}|{record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a line comes."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def _logger() -> tuple[logging.Logger, _DropBenign]:
    logger = logging.getLogger(LOGGER_NAME)
    dropping = next((f for f in logger.filters if isinstance(f, _DropBenign)), None)
    if dropping is None:
        dropping = _DropBenign()
        logger.addFilter(dropping)
        handler = _Stderr()
        handler.setFormatter(_LibrdkafkaFormat())
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)  # every line librdkafka emits (its `debug` setting says which)
        logger.propagate = False  # printed once, as librdkafka would, not again by the application's handlers
    return logger, dropping


LOGGER, _DROPPING = _logger()


def dropped_lines() -> int:
    """How many benign lines this process has dropped (for tests and diagnostics)."""
    return _DROPPING.dropped


def logged(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with their log lines routed through ``LOGGER``, unless they route them elsewhere already."""
    return {"logger": LOGGER, **settings}
