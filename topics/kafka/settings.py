"""A job's Kafka client settings: secrets referenced, never inlined, and a principal per role.

A librdkafka setting that holds a secret (``sasl.password``, ``ssl.key.password``, ``ssl.key.pem``,
``sasl.oauthbearer.client.secret``, any ``*password``, ``*secret`` or ``*passphrase``) is given as a
reference, never as its value:

- ``{env: NAME}``: the value of the environment variable ``NAME``;
- ``{file: PATH}``: the text of the file ``PATH`` (one trailing newline dropped), e.g. a mounted secret.

A reference is resolved only when a client's settings are built (``resolve_settings``); the spec, what is
recorded of it and what is printed of it keep the reference. A missing variable or file is an error that
names the setting and the reference, never a value.

``principals`` give each role of a job its own credentials: ``loader`` (every source's loaders, or
``loader.<source>`` for one source), ``constructor`` (shadows and replay too), ``trainer`` (the sink),
``observer`` (``top``, ``report``, ``autoscale``: read only) and ``operator`` (``run``, ``control``,
``topics``, ``chaos``, ``acl``'s checks). Each is a set of settings laid over the job's ``config``
(``sasl.username`` and a ``sasl.password`` reference, typically; or, on an mTLS listener, ``ssl.certificate.location``
and ``ssl.key.location``, the certificate's ``CN`` being the user). A role without one uses ``config``. The
trainer's may name ``{rank}``, a principal per data-parallel rank (``topics.kafka.rank_principals``).

Shared by the roles (``pipeline.spec``) and the trainer side (``trainer_sink.config``), which reads the
spec without ``pipeline``: this module is pure and imports no Kafka client.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topics.errors import MixflowError
from topics.kafka.rank_principals import TRAINER, for_rank

if TYPE_CHECKING:
    from cryptography import x509

SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "ssl_key",
    }
)
_SECRET_ENDINGS = ("password", "secret", "passphrase")
REFERENCE_KINDS = ("env", "file")
ROLES = ("loader", "constructor", "trainer", "observer", "operator")
"""The roles a spec's ``kafka.principals`` may name (and ``loader.<source>``)."""
SOURCE_LOADER_PREFIX = "loader."
SECRET_HINT = "reference it instead: {env: VARIABLE} or {file: /path/to/secret}"

Settings = Mapping[str, Any]


def is_secret_key(key: str) -> bool:
    """Whether the librdkafka setting ``key`` holds a secret (so only a reference may give it)."""
    return key in SECRET_KEYS or key.endswith(_SECRET_ENDINGS)


def reference_of(value: object) -> tuple[str, str] | None:
    """``(kind, target)`` when ``value`` is a well-formed reference (``{env: NAME}``, ``{file: PATH}``)."""
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, target),) = value.items()
        if kind in REFERENCE_KINDS and isinstance(target, str) and target:
            return kind, target
    return None


def shown(value: object) -> str:
    """How a reference is written in messages: ``{env: NAME}``."""
    ref = reference_of(value)
    return f"{{{ref[0]}: {ref[1]}}}" if ref else "<not a reference>"


def setting_problems(settings: Settings) -> list[tuple[str, str]]:
    """``(key, message)`` for each setting given wrongly: a secret given literally, a malformed reference,
    a reference where no secret is. The messages never hold a setting's value."""
    problems = []
    for key, value in settings.items():
        if isinstance(value, Mapping):
            if reference_of(value) is None:
                problems.append((key, "a reference is {env: VARIABLE} or {file: PATH}"))
        elif is_secret_key(key):
            problems.append((key, f"a secret must not be written in the spec; {SECRET_HINT}"))
        elif isinstance(value, float) or not isinstance(value, str | int | bool):
            problems.append((key, "must be a string, an integer or a boolean"))
    return problems


def resolve_settings(
    settings: Settings,
    where: str = "kafka.config",
    environ: Mapping[str, str] | None = None,
    read_file: Callable[[Path], str] | None = None,
) -> dict[str, Any]:
    """``settings`` with every reference replaced by what it refers to, for a client to be built with.
    Raises ``MixflowError`` naming the setting (``where``.key) and the reference of one that cannot be
    resolved; a literal secret (which a checked spec does not hold) is refused the same way."""
    env = os.environ if environ is None else environ
    read = read_file or _read_secret_file
    out: dict[str, Any] = {}
    for key, value in settings.items():
        ref = reference_of(value)
        if ref is None:
            if isinstance(value, Mapping) or is_secret_key(key):
                msg = f"{where} {key}: a secret must be given by reference; {SECRET_HINT}"
                raise MixflowError(msg)
            out[key] = value
            continue
        out[key] = resolve_reference(value, f"{where} {key}", env, read)
    return out


def resolve_reference(
    value: object,
    where: str,
    environ: Mapping[str, str] | None = None,
    read_file: Callable[[Path], str] | None = None,
) -> str:
    """The secret a reference (``{env: NAME}`` or ``{file: PATH}``) refers to. Raises ``MixflowError``
    naming ``where`` and the reference, never a value, when it cannot be resolved."""
    ref = reference_of(value)
    if ref is None:
        raise MixflowError(f"{where}: a secret must be given by reference; {SECRET_HINT}")
    kind, target = ref
    if kind == "env":
        env = os.environ if environ is None else environ
        if target not in env:
            raise MixflowError(f"{where}: {shown(value)}: the environment variable {target} is not set")
        return env[target]
    try:
        return (read_file or _read_secret_file)(Path(target))
    except OSError as exc:
        msg = f"{where}: {shown(value)}: cannot read the file: {exc.strerror or type(exc).__name__}"
        raise MixflowError(msg) from None


def _read_secret_file(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def principal_key(role: str, source: str | None = None) -> str:
    """The key of ``principals`` that a role's clients use first: ``loader.<source>`` for a source's
    loaders, else the role's name."""
    return f"{SOURCE_LOADER_PREFIX}{source}" if role == "loader" and source else role


def principal_key_problem(key: str, sources: list[str]) -> str | None:
    """What is wrong with ``key`` as a key of ``principals`` (None: nothing)."""
    if key in ROLES:
        return None
    if key.startswith(SOURCE_LOADER_PREFIX):
        source = key.removeprefix(SOURCE_LOADER_PREFIX)
        return None if source in sources else f"no source {source!r} in the spec (sources: {', '.join(sources)})"
    return f"not a role: one of {', '.join(ROLES)}, or loader.<source>"


def role_principal(principals: Mapping[str, Settings], role: str, source: str | None = None) -> str | None:
    """The key of ``principals`` whose settings a role's clients use (``loader.<source>`` before
    ``loader``), or None: the role has none and uses the job's ``config`` alone."""
    if role not in ROLES:
        msg = f"unknown role {role!r}: one of {', '.join(ROLES)}"
        raise ValueError(msg)
    for key in (principal_key(role, source), role):
        if key in principals:
            return key
    return None


def resolve_role_settings(
    config: Settings,
    principals: Mapping[str, Settings],
    role: str | None,
    source: str | None = None,
    environ: Mapping[str, str] | None = None,
    rank: int | None = None,
) -> dict[str, Any]:
    """The resolved settings of a role's clients: ``config`` with the role's principal over it (see
    ``role_principal``; ``role`` None: ``config`` alone); the trainer's with ``{rank}`` replaced by ``rank``
    first (``topics.kafka.rank_principals``). Errors name ``kafka.config`` or ``kafka.principals.<key>`` and
    the setting."""
    settings = resolve_settings(config, "kafka.config", environ)
    key = None if role is None else role_principal(principals, role, source)
    if key is not None:
        where = f"kafka.principals.{key}"
        own = for_rank(principals[key], rank, where) if key == TRAINER else principals[key]
        settings.update(resolve_settings(own, where, environ))
    return settings


def redacted(settings: Settings) -> dict[str, Any]:
    """``settings`` fit to show: references as written (``{env: NAME}``), any other secret as ``<secret>``."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if reference_of(value) is not None:
            out[key] = shown(value)
        elif is_secret_key(key) or isinstance(value, Mapping):
            out[key] = "<secret>"
        else:
            out[key] = value
    return out


CERTIFICATE_SETTINGS = ("ssl.certificate.location", "ssl.certificate.pem")
"""The librdkafka settings that give a client certificate (for mTLS: the certificate is the principal)."""
_CERTIFICATE_SUBJECT = re.compile(r"CN=([^,]+)(?:,.*)?")


def client_certificate(settings: Settings) -> x509.Certificate | None:
    """The client certificate ``settings`` give (``ssl.certificate.location``'s first PEM certificate, or
    ``ssl.certificate.pem``), or None; ``MixflowError`` naming the setting when it is not one."""
    from cryptography import x509

    for key in CERTIFICATE_SETTINGS:
        value = settings.get(key)
        if not isinstance(value, str) or not value:
            continue
        try:
            data = Path(value).read_bytes() if key == "ssl.certificate.location" else value.encode()
            return x509.load_pem_x509_certificate(data)
        except OSError as exc:
            msg = f"{key} {value}: cannot read the client certificate: {exc.strerror or type(exc).__name__}"
            raise MixflowError(msg) from None
        except ValueError:
            msg = f"{key}: not a PEM certificate" + (f" ({value})" if key == "ssl.certificate.location" else "")
            raise MixflowError(msg) from None
    return None


def certificate_principal(certificate: x509.Certificate) -> str:
    """The principal Kafka's mTLS listener makes of ``certificate`` under the secured stack's mapping rules
    (``pipeline/tools/stack/secure.py``): ``User:NAME`` for a subject that starts ``CN=NAME``, else
    ``User:`` and the whole subject."""
    subject = certificate.subject.rfc4514_string()
    match = _CERTIFICATE_SUBJECT.fullmatch(subject)
    return f"User:{match.group(1) if match else subject}"


def settings_principal(settings: Settings) -> str | None:
    """The principal a client with ``settings`` authenticates as, as ACLs name it: ``User:<sasl.username>``,
    else its client certificate's (``certificate_principal``); None when they name neither."""
    user = settings.get("sasl.username")
    if isinstance(user, str) and user:
        return f"User:{user}"
    certificate = client_certificate(settings)
    return None if certificate is None else certificate_principal(certificate)
