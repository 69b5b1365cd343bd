"""Deterministic mutation generator (faker): documents with several revisions, deletes, and event times."""

from __future__ import annotations

import random
from collections.abc import Iterator

from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage.values import Write

BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
COUNTRIES = ("KR", "US", "DE", "FR", "JP", "BR", "IN", "GB")


def generate(
    documents: int,
    mutations: int,
    *,
    seed: int = 0,
    delete_ratio: float = 0.05,
    span_ms: int = 2 * 3600 * 1000,
    disorder_ms: int = 30_000,
    prefix: str = "customer",
) -> Iterator[Write]:
    """Yield `mutations` writes over `documents` keys: first one create each, then updates and deletes.

    Each document carries `rev` (its revision, strictly increasing per key, also across a delete and
    re-create) and `ts`, an event time in epoch ms spread over `span_ms` with up to `disorder_ms` of
    disorder. The same seed gives the same writes.
    """
    from faker import Faker

    rng = random.Random(seed)
    fake = Faker()
    Faker.seed(seed)
    # Faker costs ~20 us a call; a pool of names keeps a million mutations fast and still varied.
    pool = max(1, min(documents, 2000))
    names = [fake.name() for _ in range(pool)]
    domains = [fake.free_email_domain() for _ in range(50)]
    width = len(str(max(documents - 1, 1)))
    revs = [0] * documents
    alive = [False] * documents
    for i in range(mutations):
        d = i if i < documents else rng.randrange(documents)
        key = f"{prefix}::{d:0{width}d}"
        ts = BASE_TIME_MS + (i * span_ms) // max(1, mutations) - rng.randrange(disorder_ms + 1)
        if alive[d] and i >= documents and rng.random() < delete_ratio:
            alive[d] = False
            yield Write(key, OP_DELETE)
            continue
        revs[d] += 1
        alive[d] = True
        name = names[(d * 7 + revs[d]) % pool]
        doc = {
            "name": name,
            "email": f"{name.split()[0].lower()}.{d}@{domains[d % len(domains)]}",
            "country": COUNTRIES[d % len(COUNTRIES)],
            "purchases": rng.randrange(0, 60),
            "amount": round(rng.uniform(1.0, 5000.0), 2),
            "rev": revs[d],
            "ts": ts,
        }
        yield Write(key, OP_UPDATE, encode_document(doc))
