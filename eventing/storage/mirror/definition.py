"""What a mirror is, and where it is kept: a ``MirrorDefinition`` per mirrored collection in the metadata
store (``mirror:<keyspace>``, with the index ``mirrors``), and what its follower last reported
(``mirror_status:<keyspace>``).

The source URL holds the password of the source database: it is kept in the metadata store only, as a URL
binding's secret is (eventing.core.secrets), and every view of a definition (``view``: `collection list`,
REST answers, status, stats, errors) shows it without the password (``shown_source``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from eventing.errors import ConfigError, NotFoundError

INDEX_KEY = "mirrors"
MARKS_PREFIX = "mirror:"  # the effect marks of a mirror's writes in its bucket: "mirror:<collection id>"
# The marks of a mirror (vBucket numbers of its mark rows, eventing.storage.effects): the commit LSN of the
# last source transaction applied, the chunks of the snapshot in progress, the generation of the last
# snapshot completed.
MARK_LSN, MARK_CHUNK, MARK_SNAPSHOT = 0, 1, 2


def definition_key(keyspace: str) -> str:
    return f"mirror:{keyspace}"


def status_key(keyspace: str) -> str:
    return f"mirror_status:{keyspace}"


def marks_name(cid: int) -> str:
    return f"{MARKS_PREFIX}{cid}"


def default_name(keyspace: str) -> str:
    """The slot's and publication's name for a mirror: `eventing_` + the keyspace's letters and digits +
    a short hash (slot names allow lower-case letters, digits and _ only, at most 63 of them)."""
    plain = re.sub(r"[^a-z0-9_]", "_", keyspace.lower())[:40]
    return f"eventing_{plain}_{hashlib.sha1(keyspace.encode()).hexdigest()[:6]}"


def redact(url: str) -> str:
    from metadata.postgres.location import redact as _redact

    return _redact(url)


@dataclass
class MirrorDefinition:
    keyspace: str
    source: str  # the source database's URL: a secret (see the module docstring)
    table: str  # schema.table
    publication: str
    slot: str
    own_publication: bool  # made by `collection create` (dropped with the mirror) rather than given
    cid: int = 0
    generation: int = 1  # raised by `collection resync`: a snapshot is owed while the collection's is older
    dropping: bool = False  # `collection drop` is under way: no follower may run
    created_at: float = field(default_factory=time.time)

    @property
    def shown_source(self) -> str:
        return redact(self.source)

    def describe(self) -> str:
        """What the collection mirrors, for messages: never the password."""
        return f"table {self.table} of {self.shown_source}"

    def view(self) -> dict[str, Any]:
        """The definition as every face shows it (no password)."""
        seen = asdict(self)
        seen["source"] = self.shown_source
        return seen

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MirrorDefinition:
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def mirror_keyspaces(store: Any) -> list[str]:
    text = store.get_kv(INDEX_KEY)
    return list(json.loads(text)) if text else []


def load(store: Any, keyspace: str) -> MirrorDefinition | None:
    text = store.get_kv(definition_key(keyspace))
    return MirrorDefinition.from_json(text) if text else None


def require(store: Any, keyspace: str) -> MirrorDefinition:
    found = load(store, keyspace)
    if found is None:
        names = ", ".join(mirror_keyspaces(store)) or "none"
        raise NotFoundError(
            f"keyspace '{keyspace}' is not a mirror (mirrors: {names}); create one with "
            f"`eventing collection create {keyspace} --mirror URL --table SCHEMA.TABLE`"
        )
    return found


def load_all(store: Any) -> list[MirrorDefinition]:
    return [d for ks in mirror_keyspaces(store) if (d := load(store, ks)) is not None]


def save(store: Any, definition: MirrorDefinition) -> None:
    store.set_kv(definition_key(definition.keyspace), definition.to_json())
    names = mirror_keyspaces(store)
    if definition.keyspace not in names:
        store.set_kv(INDEX_KEY, json.dumps(sorted([*names, definition.keyspace])))


def forget(store: Any, keyspace: str) -> None:
    names = mirror_keyspaces(store)
    store.set_kv(INDEX_KEY, json.dumps([n for n in names if n != keyspace]))
    store.set_kv(definition_key(keyspace), "")
    store.set_kv(status_key(keyspace), "")


def check_names(keyspace: str, table: str, publication: str | None, slot: str | None) -> tuple[str, str, str]:
    """(schema.table, publication, slot) as given or by default; ConfigError naming a bad one."""
    schema, dot, name = table.partition(".")
    if not dot:
        schema, name = "public", table
    for part in (schema, name):
        if not part or '"' in part or "\x00" in part:
            raise ConfigError(f"--table {table!r} is not a table name; give SCHEMA.TABLE (public.orders)")
    chosen = default_name(keyspace)
    slot = slot or chosen
    publication = publication or chosen
    if not re.fullmatch(r"[a-z0-9_]{1,63}", slot):
        raise ConfigError(f"--slot {slot!r} is not a slot name; use 1-63 lower-case letters, digits and _")
    if not re.fullmatch(r"[A-Za-z0-9_]{1,63}", publication):
        raise ConfigError(
            f"--publication {publication!r} is not a publication name; use 1-63 letters, digits and _"
        )
    return f"{schema}.{name}", publication, slot


def status(store: Any, keyspace: str) -> dict[str, Any]:
    """What the mirror's follower last reported (empty when none did)."""
    text = store.get_kv(status_key(keyspace))
    return json.loads(text) if text else {}


def report(store: Any, keyspace: str, values: dict[str, Any]) -> None:
    store.set_kv(status_key(keyspace), json.dumps({**values, "updated_ms": int(time.time() * 1000)}))
