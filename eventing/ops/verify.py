"""Checks a function's work against a ledger bucket: every mutation it owes accounted for, no effect twice,
each document in seqno order, no checkpoint moved backwards. Backs `eventing verify` and the test harness.

A ledger is what `eventing.testing.LEDGER_HANDLER` writes through its `ledger` binding, per handled mutation:
  - the effect `e|<function>|<key>|<seqno>`: one per mutation, so one applied twice shows up as two
    writes of the same key in the ledger bucket's log (the log keeps every version);
  - the history `h|<function>|<key>`: the document's source seqnos in the order their effects applied.
The function name in the keys lets one ledger bucket serve several functions. The ledger may be a collection
(`--ledger bucket.scope.collection`, or the binding's keyspace): its keys are then read under that
collection's prefix. A function whose source is a collection owes only that collection's mutations; the
other collections' rows of the source bucket's log are passed over and counted (`collection_filtered`), as
its workers pass them over.

A function owes every source mutation after its deployment's feed boundary up to its checkpoint, per
vBucket. Each is accounted for by an effect in the ledger, a dead letter for its (vBucket, seqno), or its
origin being the deployment itself (the recursion guard filtered it; eventing.storage.origins). Effects of
mutations past the checkpoint are allowed, since effects become durable before the checkpoint moves: a running
function can be checked. Checkpoints are read first, then dead letters, then the buckets, so whatever a
checkpoint covers is already visible. A function with a `filter` (eventing.core.filters) also accounts for
every mutation its filter does not match (`filtered`): its workers checkpoint those without calling the
handler.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import msgpack

from eventing.core.definition import FunctionDefinition
from eventing.core.filters import compile_filter
from eventing.core.keyspaces import Keyspace, split_stored_key
from eventing.core.mutation import Mutation
from eventing.core.wording import counted
from eventing.errors import ConfigError, LifecycleError, fix
from eventing.storage.keyspace import collection_id, open_keyspace
from eventing.storage.origins import is_own
from eventing.storage.protocol import BucketDocuments, FileBucket, Maintenance
from eventing.storage.state import StateLike, as_state
from sharding import NUM_VBUCKETS

EFFECT = "e|"
HISTORY = "h|"
decode = partial(msgpack.unpackb, raw=False)
EXAMPLES = 3  # examples per kind of problem in the one-line verdict


def effect_key(function: str, key: str, seqno: int) -> str:
    return f"{EFFECT}{function}|{key}|{seqno}"


def history_key(function: str, key: str) -> str:
    return f"{HISTORY}{function}|{key}"


def parse_effect_key(text: str) -> tuple[str, str, int] | None:
    """(function, document key, seqno) of an effect key; document keys may contain '|', names may not."""
    if not text.startswith(EFFECT):
        return None
    parts = text[len(EFFECT) :].split("|", 1)
    if len(parts) != 2:
        return None
    key, _, seqno = parts[1].rpartition("|")
    if not key or not seqno.isdigit():
        return None
    return parts[0], key, int(seqno)


class MutationRef(NamedTuple):
    key: str
    vb: int
    seqno: int

    def __str__(self) -> str:
        return f"{self.key}@{self.vb}:{self.seqno}"


@dataclass
class VerifyReport:
    """What a ledger check found. `ok` means every owed mutation is accounted for and nothing is wrong."""

    function: str | None = None
    ledger: str | None = None
    source_mutations: int = 0  # mutations the function owes: after the boundary, up to the checkpoints
    handled: int = 0  # ... with an effect in the ledger
    dead_lettered: int = 0  # ... with a dead letter instead
    recursion_filtered: int = 0  # ... written by the function itself, so not handled (recursion guard)
    beyond_checkpoint: int = 0  # effects of mutations past the checkpoint (a running function has some)
    past_checkpoint: int = 0  # source mutations past the checkpoint: not owed yet (the checkpoint lag)
    collection_filtered: int = 0  # rows of the source bucket's other collections: not the function's
    filtered: int = 0  # ... that the function's filter does not match, so not handled
    missing: list[MutationRef] = field(default_factory=list)
    duplicate_effects: list[str] = field(default_factory=list)  # effect keys written more than once
    duplicate_writes: int = 0  # extra writes of those keys
    out_of_order: list[str] = field(default_factory=list)  # documents whose history is not increasing
    unexpected: list[str] = field(default_factory=list)  # effect keys of no source mutation
    checkpoint_regressions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def accounted(self) -> int:
        return self.handled + self.dead_lettered + self.recursion_filtered + self.filtered

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.duplicate_effects
            or self.out_of_order
            or self.unexpected
            or self.checkpoint_regressions
        )

    def summary(self) -> str:
        """The one-line verdict."""
        counts = f"{self.accounted} of {self.source_mutations}"
        if self.ok:
            return f"ALL MUTATIONS ACCOUNTED FOR ({counts}): {self._breakdown()}"
        problems = []
        if self.missing:
            problems.append(f"{len(self.missing)} missing (e.g. {_examples(self.missing)})")
        if self.duplicate_effects:
            problems.append(
                f"{len(self.duplicate_effects)} effects applied more than once "
                f"(e.g. {_examples(self.duplicate_effects)})"
            )
        if self.out_of_order:
            problems.append(
                f"{counted(len(self.out_of_order), 'document')} out of order "
                f"(e.g. {_examples(self.out_of_order)})"
            )
        if self.unexpected:
            problems.append(
                f"{len(self.unexpected)} effects of no source mutation (e.g. {_examples(self.unexpected)})"
            )
        if self.checkpoint_regressions:
            shown = ", ".join(
                f"vb {r['vb']} {r['from_seqno']}->{r['to_seqno']} ({r['how']})"
                for r in self.checkpoint_regressions[:EXAMPLES]
            )
            moved = counted(len(self.checkpoint_regressions), "checkpoint")
            problems.append(f"{moved} moved backwards (e.g. {shown})")
        return f"NOT ALL MUTATIONS ACCOUNTED FOR ({counts}): " + "; ".join(problems)

    def _breakdown(self) -> str:
        parts = [f"{self.handled} handled"]
        if self.dead_lettered:
            parts.append(f"{self.dead_lettered} dead-lettered")
        if self.recursion_filtered:
            parts.append(f"{self.recursion_filtered} filtered by the recursion guard")
        if self.filtered:
            parts.append(f"{self.filtered} not matching the function's filter")
        text = ", ".join(parts)
        if self.collection_filtered:
            text += f"; {counted(self.collection_filtered, 'mutation')} of other collections passed over"
        if self.past_checkpoint:
            text += (
                f"; {self.past_checkpoint} more past the checkpoints, not owed yet "
                f"({self.beyond_checkpoint} of them already handled)"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "ledger": self.ledger,
            "ok": self.ok,
            "verdict": self.summary(),
            "source_mutations": self.source_mutations,
            "accounted": self.accounted,
            "handled": self.handled,
            "dead_lettered": self.dead_lettered,
            "recursion_filtered": self.recursion_filtered,
            "beyond_checkpoint": self.beyond_checkpoint,
            "past_checkpoint": self.past_checkpoint,
            "collection_filtered": self.collection_filtered,
            "filtered": self.filtered,
            "missing": [m._asdict() for m in self.missing],
            "duplicate_effects": self.duplicate_effects,
            "duplicate_writes": self.duplicate_writes,
            "out_of_order": self.out_of_order,
            "unexpected": self.unexpected,
            "checkpoint_regressions": self.checkpoint_regressions,
            "notes": self.notes,
        }


def _examples(items: Sequence[object]) -> str:
    shown = ", ".join(str(i) for i in items[:EXAMPLES])
    return shown + (", ..." if len(items) > EXAMPLES else "")


def ledger_functions(ledger: Maintenance, prefix: str = "") -> list[str]:
    """Names of the functions with effects in a ledger bucket (in its collection whose key prefix is
    `prefix`)."""
    names = set()
    for text in ledger.logged_writes(prefix + EFFECT):
        parsed = parse_effect_key(text[len(prefix) :])
        if parsed:
            names.add(parsed[0])
    return sorted(names)


def check_ledger(
    source: FileBucket,
    ledger: FileBucket,
    *,
    function: str | None = None,
    upto: Sequence[int] | None = None,
    start: Sequence[int] | None = None,
    dead_letters: Collection[tuple[int, int]] = (),
    regressions: Iterable[Mapping[str, Any]] = (),
    source_ids: Collection[int] | None = None,
    ledger_prefix: str = "",
    matches: Callable[[Mutation], bool] | None = None,
    generation: int | None = None,
) -> VerifyReport:
    """Account for every source mutation with start[vb] < seqno <= upto[vb] (all of them by default).

    `function` names whose effects to read; None means the only function with effects in the ledger.
    `dead_letters` are (vBucket, seqno) pairs with a DLQ row; `regressions` are recorded backwards
    checkpoint moves (see SqliteMetadataStore.checkpoint_regressions). `source_ids` are the ids of the
    source's collections (None: every row of the log is the function's); `ledger_prefix` is the key prefix
    of the ledger's collection (eventing.core.keyspaces.key_prefix). `matches` is the function's filter
    (None: no filter); it reads the documents, so the log is then read with them. `generation` is the
    deployment checked: a mutation counts as its own write (recursion guard) only when that deployment wrote
    it (None: any deployment of the function).
    """
    if function is None:
        found = ledger_functions(ledger, ledger_prefix)
        if len(found) > 1:
            raise ConfigError(
                f"ledger bucket '{ledger.name}' holds effects of several functions ({', '.join(found)}); "
                "name one"
            )
        function = found[0] if found else ""
    report = VerifyReport(function=function or None, ledger=ledger.name)
    report.checkpoint_regressions = [dict(r) for r in regressions]
    cut = len(ledger_prefix)
    writes = {k[cut:]: n for k, n in ledger.logged_writes(f"{ledger_prefix}{EFFECT}{function}|").items()}
    report.duplicate_effects = sorted(k for k, n in writes.items() if n > 1)
    report.duplicate_writes = sum(n - 1 for n in writes.values() if n > 1)
    dlq = set(dead_letters)
    matched: set[str] = set()
    documents: set[str] = set()
    batches: Iterable[Sequence[Any]] = source.log_index() if matches is None else source.scan_log()
    for rows in batches:
        for row in rows:
            vb, seqno, key = row[0], row[1], row[2]
            origin = row[3] if matches is None else row[6]
            if source_ids is not None:
                cid, key = split_stored_key(key)
                if cid not in source_ids:
                    report.collection_filtered += 1
                    continue
            ek = effect_key(function, key, seqno)
            has_effect = ek in writes
            if has_effect:
                matched.add(ek)
            if upto is not None and seqno > upto[vb]:
                report.past_checkpoint += 1
                report.beyond_checkpoint += has_effect
                continue
            if start is not None and seqno <= start[vb]:
                continue
            report.source_mutations += 1
            documents.add(key)
            if has_effect:
                report.handled += 1
            elif function is not None and is_own(origin, function, generation):
                report.recursion_filtered += 1
            elif (vb, seqno) in dlq:
                report.dead_lettered += 1
            elif matches is not None and not matches(row._replace(key=key)):
                report.filtered += 1
            else:
                report.missing.append(MutationRef(key, vb, seqno))
    report.unexpected = sorted(k for k in writes if k not in matched)
    for key in sorted(documents):
        history = ledger.get(ledger_prefix + history_key(function, key))
        seqs = history.get("seqs", []) if history else []
        if any(b <= a for a, b in zip(seqs, seqs[1:], strict=False)):
            report.out_of_order.append(key)
    return report


def _filter_of(defn: FunctionDefinition) -> Callable[[Mutation], bool] | None:
    """The function's filter as a test of a log entry, as its workers apply it (None: no filter)."""
    if defn.filter is None:
        return None
    compiled = compile_filter(defn.filter)
    return lambda m: compiled.matches(m, decode)


def ledger_bucket_of(defn: FunctionDefinition) -> str:
    """The keyspace of the function's read-write binding named `ledger`, or of its only read-write binding."""
    rw = [b for b in defn.bindings if b.access == "rw"]
    for b in rw:
        if b.alias == "ledger":
            return str(b.keyspace)
    if len(rw) == 1:
        return str(rw[0].keyspace)
    raise ConfigError(
        f"function '{defn.name}' has no read-write binding named 'ledger'; pass {{fix}} (or a keyspace "
        "BUCKET.SCOPE.COLLECTION)",
        fix=fix("option", flag="--ledger", value="BUCKET"),
    )


def verify_function(state: StateLike, function: str, *, ledger: str | None = None) -> VerifyReport:
    """Check a deployed (running, paused or caught-up) function against its ledger bucket."""
    state = as_state(state)
    from eventing.control.lifecycle import EPOCH_SHIFT

    with state.metadata as store:
        record = store.get_function(function)
        defn = FunctionDefinition.from_dict(record.definition)
        checkpoints = store.checkpoints(function)  # first: whatever they cover is visible below
        if not checkpoints:
            raise LifecycleError(
                f"function '{function}' has no checkpoints (it is {record.state.value}); "
                "verify a deployed or paused function"
            )
        starts = store.checkpoint_starts(function)
        dead_letters = {(r.vb, r.seqno) for r in store.dlq_rows(function, include_replayed=True)}
        regressions = store.checkpoint_regressions(function, min_epoch=record.generation << EPOCH_SHIFT)
        rewinds = store.checkpoint_rewinds(function, min_epoch=record.generation << EPOCH_SHIFT)
    ledger_name = ledger or ledger_bucket_of(defn)
    source = state.open_bucket(defn.source_bucket)
    try:
        ledger_collection = open_keyspace(state, ledger_name)
    except BaseException:
        source.close()
        raise
    target, ledger_prefix = ledger_collection.bucket, ledger_collection.prefix
    try:
        source_ids = source_collection_ids(source, defn.source_keyspace)
        if function not in ledger_functions(target, ledger_prefix):
            named = ledger is not None or any(b.alias == "ledger" for b in defn.bindings)
            if not named or not dead_letters:
                how = (
                    "the bucket given with --ledger"
                    if ledger
                    else ("its binding 'ledger'" if named else "its only read-write binding")
                )
                raise ConfigError(
                    f"function '{function}' has no ledger: bucket '{ledger_name}' ({how}) holds no ledger "
                    "entries of it; verify checks a function whose handler writes a ledger "
                    "(eventing.testing.LEDGER_HANDLER) through a binding named 'ledger', or the bucket named "
                    "with {fix}",
                    fix=fix("option", flag="--ledger", value="BUCKET"),
                )
        if any(cp.bucket_uuid != source.uuid for cp in checkpoints.values()):
            raise ConfigError(
                f"source bucket '{defn.source_bucket}' was recreated after function '{function}' was "
                "deployed; its checkpoints do not apply to it, so there is nothing to verify against"
            )
        upto = [checkpoints[vb].seqno if vb in checkpoints else 0 for vb in range(NUM_VBUCKETS)]
        start = [starts.get(vb, 0) for vb in range(NUM_VBUCKETS)]
        report = check_ledger(
            source,
            target,
            function=function,
            upto=upto,
            start=start,
            dead_letters=dead_letters,
            regressions=regressions,
            source_ids=source_ids,
            ledger_prefix=ledger_prefix,
            matches=_filter_of(defn),
            generation=record.generation,
        )
    finally:
        source.close()
        target.close()
    report.ledger = ledger_collection.name
    if not starts:
        report.notes.append("no feed boundary recorded for this deployment; counted from seqno 0")
    report.notes.extend(_rewind_notes(rewinds))
    return report


def source_collection_ids(source: BucketDocuments, keyspace: Keyspace) -> set[int]:
    """The ids of the collections a source keyspace takes (for `scope.*` and `*.*`, every one it covers)."""
    if not keyspace.is_wildcard:
        return {collection_id(source, keyspace)}
    ids = {
        cid
        for (s, c), cid in source.collections().items()
        if keyspace.covers(Keyspace(keyspace.bucket, s, c))
    }
    return ids | ({0} if keyspace.covers(Keyspace(keyspace.bucket)) else set())


def _rewind_notes(rewinds: Sequence[Mapping[str, Any]]) -> list[str]:
    """Deliberate rewinds are not regressions; say they happened, and what a reapplied one implies."""
    from metadata import REWIND_REAPPLY

    notes = []
    kept = [r for r in rewinds if r["how"] != REWIND_REAPPLY]
    again = [r for r in rewinds if r["how"] == REWIND_REAPPLY]
    if kept:
        notes.append(
            f"{len(kept)} checkpoint rewinds with effect marks kept (`eventing rewind`): the rewound ranges "
            "were handled again without applying their effects twice; not counted as regressions"
        )
    if again:
        notes.append(
            f"{len(again)} checkpoint rewinds with --reapply-effects: the effects of the rewound ranges were "
            "applied again on purpose, so those documents show duplicate effects and out-of-order histories"
        )
    return notes
