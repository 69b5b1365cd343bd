"""The benchmarks' shared workload (scripts/bench*.py): W1's trivial handler and the bucket it runs on."""

from __future__ import annotations

from eventing.storage import loadgen
from eventing.storage.protocol import FileBucket

# W1: the handler keeps a dict of each document's latest revision: the framework's own cost, with state that
from eventing.storage.state import StateLike, as_state
from eventing.storage.writes import chunked

# W1: the handler keeps a dict of each document's latest revision: the framework's own cost, with state that
# grows with the documents, never with the mutations.
TRIVIAL_HANDLER = """
seen = {}

def on_update(doc, meta):
    seen[meta.id] = doc.get("rev")

def on_delete(meta, options):
    seen.pop(meta.id, None)
"""


# W1 as a batch handler (on_batch): the same dict, made in one pass from the batch's columns, with the one
# field it keeps read as a column (the documents' other fields are never decoded).
TRIVIAL_BATCH_HANDLER = """
seen = {}

def on_batch(batch):
    for key, rev, deleted in zip(batch.keys, batch.column("rev"), batch.deleted):
        if deleted:
            seen.pop(key, None)
        else:
            seen[key] = rev
"""

# The same from whole documents (batch.docs): every document decoded, as on_update gets it.
TRIVIAL_BATCH_DOCS_HANDLER = """
seen = {}

def on_batch(batch):
    for key, doc in zip(batch.keys, batch.docs):
        if doc is None:
            seen.pop(key, None)
        else:
            seen[key] = doc.get("rev")
"""


def load_bench_bucket(
    data_dir: StateLike, name: str, documents: int, mutations: int, *, seed: int = 7, chunk: int = 50_000
) -> FileBucket:
    """A new bucket holding `mutations` faker mutations over `documents` documents (the same seed, the same
    mutations), written `chunk` a transaction."""
    bucket = as_state(data_dir).create_bucket(name)
    for part in chunked(loadgen.generate(documents, mutations, seed=seed), chunk):
        bucket.write(part)
    return bucket
