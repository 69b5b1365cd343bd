"""fn_ledger: the ledger handler of the test harness (eventing.testing.LEDGER_HANDLER is this file's text), so
`eventing verify` can check a function end to end (docs/operations.md). Per handled mutation it writes an
effect `e|FN|key|seqno` and the document's history `h|FN|key` through the read-write binding `ledger`;
FUNCTION, CALL_LOG and SLEEP_MS are constants of the definition."""

import os


def _record(meta, op, rev):
    ledger[f"e|{FUNCTION}|{meta.id}|{meta.seq}"] = {
        "fn": FUNCTION,
        "key": meta.id,
        "seq": meta.seq,
        "vb": meta.vb,
        "op": op,
        "rev": rev,
    }
    history = ledger.get(f"h|{FUNCTION}|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{FUNCTION}|{meta.id}"] = history
    if CALL_LOG:
        with open(CALL_LOG, "a") as f:
            f.write(f"{meta.id} {meta.seq} {os.getpid()}\n")


def on_update(doc, meta):
    if SLEEP_MS:
        import time

        time.sleep(SLEEP_MS / 1000)
    _record(meta, "update", doc.get("rev"))


def on_delete(meta, options):
    _record(meta, "expire" if options.expired else "delete", None)
