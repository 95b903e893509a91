"""Rights a chaos run takes away a while and gives back: one role's Kafka ACL bindings on a secured run
(``revoke-acls``: those ``mixflow acl apply`` grants its ``kafka.principals`` key, deleted, then created again
with the admin's credentials) or the object store key the loaders read ``s3://`` sources with
(``revoke-storage-key``: the store's user removed, then added again with the same keys).

Each ``Access`` says which roles it strikes (by the run's role names) and what their refusal names: a role
struck stops with exit 5 and one line naming the principal (or the store's refusal of the key), which the run's
supervisor takes for a refusal, not a failure, and starts the role again once the rights are back."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pipeline.spec import JobSpec
from pipeline.tools.chaos.object_store import ChaosObjectStore
from topics.kafka.acl_admin import AclAdmin
from topics.kafka.acls import Binding, job_bindings, principal_name
from topics.kafka.settings import SOURCE_LOADER_PREFIX

# The refusal of a storage key, as connectors.storage.faults words it (403, or a 404 about the key).
STORAGE_REFUSAL = re.compile(r"s3://\S+.*(access denied|refuses these credentials)")


class Access(Protocol):
    what: str  # for the report: "the ACLs of User:<job>-trainer (5 bindings)"
    names: re.Pattern[str]  # what a struck role's last error line says

    def strikes(self, role: str) -> bool: ...

    def revoke(self) -> None: ...

    def restore(self) -> None: ...


def role_prefix(key: str) -> str:
    """The run's role names for the principal ``key``: ``load-<source>-``, ``construct-`` (the active
    constructor and its shadows, which share the principal) or ``sink-`` (every rank's trainer)."""
    if key.startswith(SOURCE_LOADER_PREFIX):
        return f"load-{key.removeprefix(SOURCE_LOADER_PREFIX)}-"
    prefixes = {"constructor": "construct-", "trainer": "sink-"}
    if key not in prefixes:
        msg = f"no role of a chaos run runs as the principal {key!r}"
        raise ValueError(msg)
    return prefixes[key]


def revocable_principals(keys: Iterable[str]) -> tuple[str, ...]:
    """The ``kafka.principals`` keys of ``keys`` whose ACLs a run can revoke: the loaders', the constructor's
    and the trainer's (the operator's clients are the run's own)."""
    return tuple(sorted(k for k in keys if k.startswith(SOURCE_LOADER_PREFIX) or k in ("constructor", "trainer")))


@dataclass
class KafkaRights:
    """The ACL bindings of one principal key of ``spec``'s job."""

    admin: AclAdmin
    key: str
    bindings: list[Binding]
    principal: str

    @classmethod
    def of(cls, admin: AclAdmin, spec: JobSpec, key: str) -> KafkaRights:
        bindings = job_bindings(spec.job, spec.source_names, spec.kafka.principals, spec.step.ranks)[key]
        principal = principal_name(spec.kafka.principals[key])
        assert principal is not None, f"the principal {key} names a user"
        return cls(admin, key, bindings, principal)

    @property
    def what(self) -> str:
        return f"the ACLs of {self.principal} ({len(self.bindings)} bindings)"

    @property
    def names(self) -> re.Pattern[str]:
        return re.compile(f"refused {re.escape(self.principal)} ")

    def strikes(self, role: str) -> bool:
        return role.startswith(role_prefix(self.key))

    def revoke(self) -> None:
        self.admin.delete(self.bindings)

    def restore(self) -> None:
        self.admin.create(self.bindings)


@dataclass
class StorageKey:
    """The key the loaders of ``sources`` (those read from the store) read it with: a user of the store."""

    store: ChaosObjectStore
    sources: tuple[str, ...]
    names: re.Pattern[str] = STORAGE_REFUSAL

    @property
    def what(self) -> str:
        assert self.store.user is not None, "a storage key to revoke"
        return f"the object store key {self.store.user.access_key}"

    def strikes(self, role: str) -> bool:
        return any(role.startswith(f"load-{source}-") for source in self.sources)

    def revoke(self) -> None:
        self.store.remove_user()

    def restore(self) -> None:
        self.store.add_user()
