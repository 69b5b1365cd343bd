"""Idempotency keys of handler calls (see docs/handler-api.md, "Idempotency keys").

A mutation's key is derived from what names it for good: the function, the source bucket's identity (its
uuid: a flushed or recreated bucket is another bucket) and the mutation's (vBucket, seqno). Every attempt
of the same mutation in the same function gets the same key, whoever runs it: a retry, a worker restarted
after a crash, `dlq replay`, a rewind, a redeploy from `everything`. Another mutation or another function
gets another key.

A fired timer's key is derived from the function, its callback and reference and the time it was due, so
a timer fired again (its worker died before recording it, `dlq replay` of its letter, the same timer made
again by a redeploy) has the key it had; the same timer set again for another time has another.

Keys are 32 hex digits (128 bits of SHA-256), with a prefix telling a mutation's (`m`) from a timer's
(`t`): short enough for every server that honours the header (Stripe takes 255 characters).
"""

from __future__ import annotations

import hashlib

import msgpack

from eventing.core.mutation import OP_TIMER, Mutation

HEADER = "Idempotency-Key"  # the header curl sends it in, unless the URL binding renames or turns it off


def key_base(function: str, bucket_uuid: str) -> bytes:
    """What every key of a function's mutations starts from (computed once per runner)."""
    return f"{function}\0{bucket_uuid}\0".encode()


def mutation_key(base: bytes, vb: int, seqno: int) -> str:
    """The key of the source mutation (vb, seqno) of the function whose key_base is `base`."""
    return "m" + hashlib.sha256(base + f"{vb}:{seqno}".encode()).hexdigest()[:32]


def timer_key(base: bytes, callback: str, reference: str, due_ms: int) -> str:
    """The key of a timer's firing: (callback, reference) is the timer, due_ms the time it was set for."""
    return "t" + hashlib.sha256(base + f"timer\0{callback}\0{reference}\0{due_ms}".encode()).hexdigest()[:32]


def key_of(base: bytes, m: Mutation) -> str:
    """The key of the call running on `m`: a source mutation's, or a fired timer's (its record names the
    callback; see eventing.execution.timers.fired_mutation)."""
    if m.op != OP_TIMER:
        return mutation_key(base, m.vb, m.seqno)
    try:
        callback = msgpack.unpackb(m.doc, raw=False)["callback"] if m.doc is not None else ""
    except Exception:  # noqa: BLE001 - a damaged record still has a key: by its position
        callback = f"#{m.vb}:{m.seqno}"
    return timer_key(base, str(callback), m.key, m.cas)


def batch_key(keys: list[str]) -> str:
    """The key of a request an on_batch handler makes outside any item: derived from the batch's items'
    keys, so the same items (in the same order) give the same key."""
    return "b" + hashlib.sha256("\0".join(keys).encode()).hexdigest()[:32]


def request_key(key: str, n: int) -> str:
    """The header of the call's n-th request (1-based): the key itself, then the key with a suffix, so a
    call that makes several requests sends each its own key, the same at every attempt."""
    return key if n == 1 else f"{key}-{n}"
