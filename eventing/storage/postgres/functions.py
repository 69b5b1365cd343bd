"""Functions the store keeps on the server, created with the bucket tables
(eventing.storage.postgres.schema).

``eventing_apply_effects`` is a flush of binding effects in the usual case
(eventing.storage.postgres.effects): no write fenced or applied already, every write an update that gives no
extended attributes of its own, and no write conditional on a cas. Run as one statement it does what the
client otherwise sends as five (the marks locked, the high seqnos locked, the probe for extended
attributes, the rows, the marks moved), with the plans cached in the server's session, so the transaction
is one round trip (docs/benchmarks.md, "PostgreSQL store", has what it saves).

It takes the same locks in the same order as the statements it replaces (marks first, then high seqnos,
each in vBucket order). Where it finds a mark that fences a group or already covers one of its writes, or a
vBucket without its high seqno row, it changes nothing but the marks it had to make (epoch 0, seqno 0, what
a missing mark means) and answers false: the client then runs the general path, which sorts out each group.

Called as a statement of its own, outside a transaction (metadata.postgres.connection's ``call``): the
statement is the transaction. It inserts the commit token it is given (metadata.postgres.commits) only when it
applied the writes, so a call whose answer was lost committed its writes exactly when the token is there.

Parameters:

- the commit token, the bucket's id, the function (whose marks), the writes' origin, the arrival time
  (ms; a vBucket's is never below its last one);
- ``g_*``: each group's vBucket, epoch and lowest source seqno (NULL for a group without writes);
- ``u_*``: each vBucket of the groups once, sorted: the last group's epoch and the highest seqno to mark;
- ``i_*``: the writes in the batch's order: vBucket, key, document, expiry, flags, cas. A vBucket's new
  seqnos follow that order.
"""

from __future__ import annotations

LOG_UPDATES = r"""
CREATE OR REPLACE FUNCTION eventing_log_updates(
    p_bucket integer, p_origin text, p_arrival bigint,
    i_vb int2[], i_key text[], i_doc bytea[], i_expiry int8[], i_flags int8[], i_cas int8[]
) RETURNS int8[] LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    targets int2[];
    h_vb int2[];
    h_seqno int8[];
    h_arrival int8[];
    holds boolean;
    seqnos int8[];
BEGIN
    -- The high seqnos of the vBuckets written, locked in vBucket order (as eventing.storage.postgres.writer).
    targets := ARRAY(SELECT DISTINCT t.vb FROM unnest(i_vb) AS t(vb) ORDER BY t.vb);
    SELECT array_agg(h.vb), array_agg(h.seqno), array_agg(h.arrival_ms) INTO h_vb, h_seqno, h_arrival FROM (
        SELECT vb, seqno, arrival_ms FROM bucket_high WHERE bucket = p_bucket AND vb = ANY(targets) ORDER BY vb
        FOR UPDATE) h;
    IF coalesce(cardinality(h_vb), 0) < cardinality(targets) THEN
        RETURN NULL;
    END IF;
    -- An update keeps the extended attributes of its live, unexpired document.
    holds := EXISTS(SELECT 1 FROM bucket_docs WHERE bucket = p_bucket AND xattrs IS NOT NULL);
    WITH r AS (
        SELECT i.ord, i.vb, h.seqno + row_number() OVER (PARTITION BY i.vb ORDER BY i.ord) AS seqno, i.key, i.cas,
            i.doc, i.expiry, i.flags, greatest(p_arrival, h.arrival_ms) AS arrival_ms,
            CASE WHEN holds THEN (
                SELECT d.xattrs FROM bucket_docs d
                WHERE d.bucket = p_bucket AND d.key = i.key AND d.xattrs IS NOT NULL AND NOT d.deleted
                    AND (d.expiry = 0 OR d.expiry > p_arrival / 1000)) END AS xattrs
        FROM unnest(i_vb, i_key, i_doc, i_expiry, i_flags, i_cas) WITH ORDINALITY
            AS i(vb, key, doc, expiry, flags, cas, ord)
        JOIN unnest(h_vb, h_seqno, h_arrival) AS h(vb, seqno, arrival_ms) ON h.vb = i.vb
    ), l AS (
        INSERT INTO bucket_log(bucket, vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms, xattrs)
        SELECT p_bucket, vb, seqno, key, 0, cas, doc, p_origin, expiry, flags, arrival_ms, xattrs FROM r
    ), d AS (
        INSERT INTO bucket_docs(bucket, key, vb, seqno, cas, deleted, doc, expiry, flags, xattrs)
        SELECT DISTINCT ON (key) p_bucket, key, vb, seqno, cas, false, doc, expiry, flags, xattrs
        FROM r ORDER BY key, seqno DESC
        ON CONFLICT (bucket, key) DO UPDATE SET vb = excluded.vb, seqno = excluded.seqno, cas = excluded.cas,
            deleted = false, doc = excluded.doc, expiry = excluded.expiry, flags = excluded.flags,
            xattrs = excluded.xattrs
    ), moved AS (
        UPDATE bucket_high h SET seqno = m.seqno, arrival_ms = m.arrival_ms
        FROM (SELECT vb, max(seqno) AS seqno, max(arrival_ms) AS arrival_ms FROM r GROUP BY vb) m
        WHERE h.bucket = p_bucket AND h.vb = ANY(targets) AND h.vb = m.vb
    )
    SELECT array_agg(r.seqno ORDER BY r.ord) INTO seqnos FROM r;
    RETURN seqnos;
END
$fn$
"""  # noqa: E501

APPLY_EFFECTS = r"""
CREATE OR REPLACE FUNCTION eventing_apply_effects(
    p_token uuid, p_bucket integer, p_function text, p_origin text, p_arrival bigint,
    g_vb int2[], g_epoch int8[], g_lowest int8[],
    u_vb int2[], u_epoch int8[], u_seqno int8[],
    i_vb int2[], i_key text[], i_doc bytea[], i_expiry int8[], i_flags int8[], i_cas int8[]
) RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    m_vb int2[];
    m_epoch int8[];
    m_seqno int8[];
BEGIN
    -- The marks, each found by its primary key and locked in vBucket order; the missing ones made. Every
    -- statement here finds its rows by primary key whatever the plan's estimates: a generic plan took
    -- (bucket, function) for one row and read all of the function's 1,024 marks.
    SELECT array_agg(m.vb), array_agg(m.epoch), array_agg(m.seqno) INTO m_vb, m_epoch, m_seqno
    FROM unnest(u_vb) AS k(vb) CROSS JOIN LATERAL (
        SELECT vb, epoch, seqno FROM bucket_effect_marks
        WHERE bucket = p_bucket AND function = p_function AND vb = k.vb FOR UPDATE) m;
    IF coalesce(cardinality(m_vb), 0) < cardinality(u_vb) THEN
        INSERT INTO bucket_effect_marks(bucket, function, vb, epoch, seqno)
        SELECT p_bucket, p_function, k.vb, 0, 0 FROM unnest(u_vb) AS k(vb) ON CONFLICT DO NOTHING;
        SELECT array_agg(m.vb), array_agg(m.epoch), array_agg(m.seqno) INTO m_vb, m_epoch, m_seqno
        FROM unnest(u_vb) AS k(vb) CROSS JOIN LATERAL (
            SELECT vb, epoch, seqno FROM bucket_effect_marks
            WHERE bucket = p_bucket AND function = p_function AND vb = k.vb FOR UPDATE) m;
    END IF;
    IF EXISTS (
        SELECT 1 FROM unnest(g_vb, g_epoch, g_lowest) AS g(vb, epoch, lowest)
        JOIN unnest(m_vb, m_epoch, m_seqno) AS m(vb, epoch, seqno) ON m.vb = g.vb
        WHERE m.epoch > g.epoch OR g.lowest <= m.seqno
    ) THEN
        RETURN false;
    END IF;
    IF cardinality(i_vb) > 0 THEN
        IF eventing_log_updates(p_bucket, p_origin, p_arrival, i_vb, i_key, i_doc, i_expiry, i_flags, i_cas)
            IS NULL THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO bucket_effect_marks(bucket, function, vb, epoch, seqno)
    SELECT p_bucket, p_function, u.vb, u.epoch, u.seqno FROM unnest(u_vb, u_epoch, u_seqno) AS u(vb, epoch, seqno)
    ON CONFLICT (bucket, function, vb) DO UPDATE SET epoch = excluded.epoch,
        seqno = GREATEST(bucket_effect_marks.seqno, excluded.seqno);
    INSERT INTO eventing_commits VALUES (p_token);
    RETURN true;
END
$fn$
"""  # noqa: E501

WRITE_UPDATES = r"""
CREATE OR REPLACE FUNCTION eventing_write_updates(
    p_token uuid, p_bucket integer, p_origin text, p_arrival bigint,
    i_vb int2[], i_key text[], i_doc bytea[], i_expiry int8[], i_flags int8[], i_cas int8[]
) RETURNS int8[] LANGUAGE plpgsql AS $fn$
DECLARE
    seqnos int8[];
BEGIN
    seqnos := eventing_log_updates(
        p_bucket, p_origin, p_arrival, i_vb, i_key, i_doc, i_expiry, i_flags, i_cas);
    IF seqnos IS NOT NULL THEN
        INSERT INTO eventing_commits VALUES (p_token);
    END IF;
    RETURN seqnos;
END
$fn$
"""

FUNCTIONS = (LOG_UPDATES, APPLY_EFFECTS, WRITE_UPDATES)

__all__ = ["APPLY_EFFECTS", "FUNCTIONS", "LOG_UPDATES", "WRITE_UPDATES"]
