"""A test harness shipped with the product: a ledger handler and a checker that counts, per mutation,
whether it was handled exactly once and in per-document order.

The ledger handler writes, through a read-write binding `ledger`:
  - `e|<key>|<seqno>`: one effect per handled mutation (so an effect applied twice shows up as two
    mutations of the same key in the ledger bucket's log);
  - `h|<key>`: the document's history, the list of source seqnos in the order their effects applied
    (it reads its own previous write, so a reordering or a lost effect is visible in the list).
Set the constant `CALL_LOG` to a file path to also record every handler call (at-least-once).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from eventing.bucket import LocalBucket
from eventing.definition import FunctionDefinition
from eventing.mutation import OP_UPDATE

LEDGER_HANDLER = '''
import os

def _record(meta, op, rev):
    ledger[f"e|{meta.id}|{meta.seq}"] = {"key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": op, "rev": rev}
    history = ledger.get(f"h|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{meta.id}"] = history
    if CALL_LOG:
        with open(CALL_LOG, "a") as f:
            f.write(f"{meta.id} {meta.seq} {os.getpid()}\\n")

def on_update(doc, meta):
    if SLEEP_MS:
        import time
        time.sleep(SLEEP_MS / 1000)
    _record(meta, "update", doc.get("rev"))

def on_delete(meta, options):
    _record(meta, "expire" if options.expired else "delete", None)
'''


def ledger_definition(
    name: str, source: str, ledger: str, *, workers: int = 2, call_log: str | None = None, sleep_ms: float = 0, **extra
) -> FunctionDefinition:
    return FunctionDefinition.from_dict({
        "name": name,
        "source_bucket": source,
        "bindings": [{"alias": "ledger", "bucket": ledger, "access": "rw"}],
        "constants": {"CALL_LOG": call_log or "", "SLEEP_MS": sleep_ms},
        "worker_count": workers,
        "checkpoint_interval": "100ms",
        **extra,
    })


@dataclass
class LedgerReport:
    source_mutations: int = 0
    handled: int = 0
    missing: list[tuple[str, int]] = field(default_factory=list)
    duplicate_effects: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicate_effects or self.out_of_order or self.unexpected)

    def summary(self) -> str:
        if self.ok:
            return f"ALL MUTATIONS ACCOUNTED FOR ({self.handled} of {self.source_mutations})"
        parts = []
        for label, items in (("missing", self.missing), ("duplicated", self.duplicate_effects),
                             ("out of order", self.out_of_order), ("unexpected", self.unexpected)):
            if items:
                parts.append(f"{len(items)} {label} (e.g. {items[:3]})")
        return "; ".join(parts)


def check_ledger(source: LocalBucket, ledger: LocalBucket, *, upto: list[int] | None = None) -> LedgerReport:
    """Count every source mutation (up to `upto[vb]` if given) against the ledger's effects."""
    report = LedgerReport()
    expected: dict[str, list[int]] = defaultdict(list)
    expected_keys: set[str] = set()
    for batch in source.scan_log():
        for m in batch:
            if upto is not None and m.seqno > upto[m.vb]:
                continue
            report.source_mutations += 1
            expected[m.key].append(m.seqno)
            expected_keys.add(f"e|{m.key}|{m.seqno}")
    writes: Counter[str] = Counter()
    for batch in ledger.scan_log():
        for m in batch:
            if m.op == OP_UPDATE and m.key.startswith("e|"):
                writes[m.key] += 1
    report.handled = sum(1 for k in writes if k in expected_keys)
    report.duplicate_effects = sorted(k for k, n in writes.items() if n > 1)
    report.unexpected = sorted(k for k in writes if k not in expected_keys)
    report.missing = sorted(
        (k.split("|")[1], int(k.split("|")[2])) for k in expected_keys if k not in writes
    )
    for key in expected:
        history = ledger.get(f"h|{key}")
        got = history["seqs"] if history else []
        if any(b <= a for a, b in zip(got, got[1:], strict=False)):
            report.out_of_order.append(key)
    return report


def read_call_log(path: str | Path) -> dict[str, list[int]]:
    """Handler calls per document key, in the order they were made (per process)."""
    calls: dict[str, list[int]] = defaultdict(list)
    if not os.path.exists(path):
        return calls
    with open(path) as f:
        for line in f:
            key, seq, _pid = line.split()
            calls[key].append(int(seq))
    return calls
