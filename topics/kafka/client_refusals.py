"""What a secured cluster's refusal of a client means, read from librdkafka's error and log lines: a wrong
password or an unknown user, a broker certificate the client cannot trust (another CA, another host, expired),
a client certificate the broker will not take on an mTLS listener (none, from another CA, expired), or a client
that speaks without TLS or without credentials to a listener that wants them.

``refusal(config, line)`` is the one-line reason, or None when ``line`` is no such refusal (a broker that is
down, a name that does not resolve). It never quotes a secret of ``config``: it names the user, the
mechanism, the CA file and the listener only.

librdkafka says only that a broker's certificate could not be verified, not why; ``certificate_problem`` asks
the listener again with Python's TLS (the same CA, the same name) for OpenSSL's reason, which ``refusal``
then gives. The broker says only, by a TLS alert, that it did not take the client's certificate; why is read
from the certificate itself (``client_certificate_problem``)."""

from __future__ import annotations

import datetime
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature

from topics.errors import MixflowError
from topics.kafka.settings import certificate_principal, client_certificate

if TYPE_CHECKING:
    from cryptography import x509

_LISTENER = re.compile(r"\b((?:sasl_ssl|sasl_plaintext|ssl|plaintext)://[^/\s:]+:\d+)", re.IGNORECASE)
_ADDRESS = re.compile(r"(?:^|\s)([^\s\[\]]+:\d+)/(?:bootstrap|\d+): ")
_CERTIFICATE_PROBLEMS = (
    ("certificate has expired", "the broker's certificate has expired (or is not valid yet)"),
    ("certificate is not yet valid", "the broker's certificate is not valid yet (or has expired)"),
    ("hostname mismatch", "the broker's certificate is for another host: its names do not include {host}"),
    ("ip address mismatch", "the broker's certificate is for another host: its names do not include {host}"),
    ("unable to get local issuer certificate", "the broker's certificate is not signed by the CA this client trusts"),
    ("self-signed certificate", "the broker's certificate is not signed by the CA this client trusts"),
    ("self signed certificate", "the broker's certificate is not signed by the CA this client trusts"),
    ("certificate verify failed", "the broker's certificate could not be verified against the CA this client trusts"),
)
# OpenSSL's names of the TLS alerts a broker sends when it does not take the client's certificate.
_CLIENT_CERTIFICATE_ALERTS = (
    "alert bad certificate",
    "alert certificate unknown",
    "alert certificate required",
    "alert unknown ca",
    "alert certificate expired",
    "alert unsupported certificate",
    "alert certificate revoked",
)
_ISSUE_HINT = "`mixflow users add NAME --cert` issues one from the local stack's CA"


def listener_of(line: str) -> str | None:
    """The listener a librdkafka line names (``sasl_ssl://host:port``), or its bare address."""
    if match := _LISTENER.search(line):
        return match.group(1).lower()
    if match := _ADDRESS.search(line):
        return match.group(1)
    return None


def refusal(config: Mapping[str, Any], line: str, verify_message: str | None = None) -> str | None:
    """The reason a secured listener refused the client with ``config``, as ``line`` (a librdkafka error or log
    line) and, for a certificate, OpenSSL's ``verify_message`` say it; None when ``line`` says something else."""
    lowered = line.lower()
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if "sasl authentication error" in lowered or "authentication failed" in lowered:
        return _authentication(config, lowered)
    if any(alert in lowered for alert in _CLIENT_CERTIFICATE_ALERTS):
        return client_certificate_problem(config)
    if "ssl handshake failed" in lowered or "certificate verify failed" in lowered or "ssl routines" in lowered:
        return _tls(config, f"{verify_message or ''} {lowered}".lower(), line)
    if protocol == "plaintext" and "closed by peer" in lowered and "apiversion_query" in lowered:
        return (
            "the listener closed the connection before answering: it wants TLS (and credentials), and this client "
            "has neither (security.protocol is PLAINTEXT; a secured cluster needs SASL_SSL with sasl.mechanism, "
            "sasl.username, sasl.password and ssl.ca.location)"
        )
    if protocol == "ssl" and "ssl connection closed by peer" in lowered:
        return (
            "the listener closed the TLS connection: it wants SASL credentials too, and this client has none "
            "(security.protocol is SSL; use SASL_SSL with sasl.mechanism, sasl.username and sasl.password, or a "
            "client certificate on the cluster's mTLS listener)"
        )
    return None


def client_certificate_problem(config: Mapping[str, Any], now: datetime.datetime | None = None) -> str:
    """Why a broker would not take the client certificate of ``config``, as far as the certificate itself says:
    none given, expired (or not valid yet), not issued by the CA of ``ssl.ca.location``; else that the broker
    does not trust it. Names the certificate's file and principal, never the key."""
    try:
        certificate = client_certificate(config)
    except MixflowError as exc:
        return f"the listener wants a client certificate, and this client's cannot be read: {exc}"
    if certificate is None:
        return (
            "the listener wants a client certificate (mTLS), and this client has none: set "
            f"ssl.certificate.location and ssl.key.location ({_ISSUE_HINT})"
        )
    where = config.get("ssl.certificate.location") or "ssl.certificate.pem"
    which = f"this client's certificate ({where}, {certificate_principal(certificate)})"
    moment = now or datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc < moment:
        return (
            f"{which} expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: issue a new one ({_ISSUE_HINT})"
        )
    if certificate.not_valid_before_utc > moment:
        return f"{which} is not valid until {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    issuer = certificate.issuer.rfc4514_string()
    signed = _signed_by_ca_of(certificate, config.get("ssl.ca.location"))
    if signed is False:
        return (
            f"the broker does not trust {which}: it is issued by {issuer!r} but not signed by the CA in "
            f"ssl.ca.location ({config['ssl.ca.location']}; a secured local stack's broker trusts its own CA "
            f"only: {_ISSUE_HINT})"
        )
    return f"the broker does not trust {which}, issued by {issuer!r}"


def _signed_by_ca_of(certificate: x509.Certificate, ca_location: object) -> bool | None:
    """Whether a certificate of the CA file ``ca_location`` signed ``certificate``; None when there is none to
    read."""
    from cryptography import x509

    if not isinstance(ca_location, str) or not ca_location:
        return None
    try:
        authorities = x509.load_pem_x509_certificates(Path(ca_location).read_bytes())
    except (OSError, ValueError):
        return None
    for authority in authorities:
        try:
            certificate.verify_directly_issued_by(authority)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False
    try:
        return x509.load_pem_x509_certificate(Path(ca_location).read_bytes()).subject.rfc4514_string()
    except (OSError, ValueError):
        return None


def _authentication(config: Mapping[str, Any], lowered: str) -> str:
    user = config.get("sasl.username")
    mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI"))).upper()
    if user is None:
        return f"SASL/{mechanism} authentication failed: this client has no credentials (set sasl.username)"
    if "invalid credentials" in lowered:
        return (
            f"SASL/{mechanism} authentication as user {user!r} failed: wrong password or unknown user (the broker "
            "does not say which); check sasl.username and sasl.password"
        )
    if "unsupported sasl mechanism" in lowered or ("mechanism" in lowered and "not enabled" in lowered):
        return f"the listener does not offer SASL mechanism {mechanism} (user {user!r}); check sasl.mechanism"
    return f"SASL/{mechanism} authentication as user {user!r} failed"


def _tls(config: Mapping[str, Any], lowered: str, line: str) -> str:
    ca = config.get("ssl.ca.location")
    trusted = f" (ssl.ca.location {ca})" if ca else " (the system's CAs: ssl.ca.location is not set)"
    host = _host_of(listener_of(line) or "")
    for clue, problem in _CERTIFICATE_PROBLEMS:
        if clue in lowered:
            return "TLS handshake failed: " + problem.format(host=host or "the address connected to") + trusted
    return f"TLS handshake failed{trusted}"


def _host_of(listener: str) -> str:
    return listener.rpartition("://")[2].rpartition(":")[0]


def is_certificate_refusal(line: str) -> bool:
    return "certificate verify failed" in line.lower()


def certificate_problem(listener: str, ca_location: str | None, timeout_s: float = 3.0) -> str | None:
    """OpenSSL's reason for refusing the certificate of ``listener`` (``[protocol://]host:port``) against the
    CA file (the system's CAs when None), checking the host name as librdkafka does; None when it is accepted
    or the listener cannot be reached."""
    host, _, port = listener.rpartition("://")[2].rpartition(":")
    context = ssl.create_default_context(cafile=ca_location)
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    except (OSError, ValueError):
        return None
