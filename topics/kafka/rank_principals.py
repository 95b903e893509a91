"""A principal per data-parallel rank for the trainers: ``{rank}`` in ``kafka.principals.trainer``.

Any value of the trainer's settings may name ``{rank}``, a reference's variable name or file path included; a
rank's sink replaces it with its rank's number before it resolves the references::

    trainer: {sasl.username: example-trainer-{rank}, sasl.password: {env: PW_TRAINER_{rank}}}

gives rank 3's trainers the user ``example-trainer-3`` and the password in ``$PW_TRAINER_3``; on an mTLS
listener, ``ssl.certificate.location: /run/secrets/trainer-{rank}.pem`` does the same. ``mixflow acl apply``
then grants each rank's principal its own rank topic only (``topics.kafka.acls``). ``{rank}`` in
``kafka.config`` or another role's settings, and any other ``{name}``, are errors of the spec: nothing else is
replaced, and a placeholder left as it is would name a user or a variable that does not exist.

Pure: shared by the spec's checks (``pipeline.spec``), the trainer side (``trainer_sink.config``) and the ACL plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from topics.errors import MixflowError

TRAINER = "trainer"
"""The ``kafka.principals`` key whose settings may name the rank."""
RANK_PLACEHOLDER = "{rank}"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _texts(value: object) -> list[str]:
    """The strings of a setting's value in which a placeholder is replaced: the value, or a reference's target."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping) and len(value) == 1:
        return [v for v in value.values() if isinstance(v, str)]
    return []


def placeholder_problems(settings: Mapping[str, Any], key: str | None) -> list[tuple[str, str]]:
    """``(setting, message)`` for each setting of ``kafka.principals.<key>`` (``key`` None: ``kafka.config``)
    that names a placeholder it may not: ``{rank}`` outside the trainer's settings, any other ``{name}``
    anywhere. The messages never hold a setting's value."""
    problems = []
    for setting, value in settings.items():
        names = [name for text in _texts(value) for name in _PLACEHOLDER.findall(text)]
        if unknown := sorted({name for name in names if name != "rank"}):
            shown = ", ".join(f"{{{name}}}" for name in unknown)
            message = f"unknown placeholder {shown}: only {RANK_PLACEHOLDER} is replaced, in kafka.principals.trainer"
            problems.append((setting, message))
        elif names and key != TRAINER:
            message = (
                f"{RANK_PLACEHOLDER} is replaced only in kafka.principals.trainer (a principal per rank's trainers)"
            )
            problems.append((setting, message))
    return problems


def names_rank(settings: Mapping[str, Any]) -> bool:
    """Whether ``settings`` (the trainer's) name ``{rank}``: each rank's trainers are then a principal of their own."""
    return any(RANK_PLACEHOLDER in text for value in settings.values() for text in _texts(value))


def for_rank(settings: Mapping[str, Any], rank: int | None, where: str = "kafka.principals.trainer") -> dict[str, Any]:
    """``settings`` with ``{rank}`` replaced by ``rank`` in every value and reference target; ``MixflowError``
    naming ``where`` when they name it and no rank is given."""
    if not names_rank(settings):
        return dict(settings)
    if rank is None:
        msg = f"{where} names {RANK_PLACEHOLDER}: only a rank's trainer (its sink, given its rank) has these settings"
        raise MixflowError(msg)
    return {setting: _replaced(value, str(rank)) for setting, value in settings.items()}


def _replaced(value: Any, number: str) -> Any:
    if isinstance(value, str):
        return value.replace(RANK_PLACEHOLDER, number)
    if isinstance(value, Mapping) and len(value) == 1:  # a reference: its target
        return {kind: _replaced(target, number) for kind, target in value.items()}
    return value
