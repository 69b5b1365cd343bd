"""Mirrors: a collection whose documents follow a table of an application's PostgreSQL database through
logical replication (docs/postgresql-mirror.md; docs/architecture.md, 'Mirrors').

- ``definition``: what a mirror is (keyspace, table, publication, slot, the source URL kept as a secret),
  kept in the metadata store; the names of its slot and publication;
- ``pgoutput``: the decoder of PostgreSQL's logical replication messages;
- ``pgtypes``: column values as JSON values, by type;
- ``source``: connections to the source database, its checks, the publication and slot;
- ``follower``: the process that takes the snapshot and follows the slot into the collection, exactly once.
"""
