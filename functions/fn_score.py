"""fn_score: scores each customer from their purchases and keeps the score in the `scores` bucket.

score = 10 x purchases + amount / 10, capped at 1000; tier gold >= 500, silver >= 200, else bronze.
The `customers` bucket is bound read-only as `src` to show a read binding; `scores` is read-write.
"""


def tier_of(score):
    if score >= GOLD:
        return "gold"
    if score >= SILVER:
        return "silver"
    return "bronze"


def on_update(doc, meta):
    score = min(1000.0, 10 * doc.get("purchases", 0) + doc.get("amount", 0.0) / 10)
    previous = scores.get(meta.id)
    scores[meta.id] = {
        "score": round(score, 2),
        "tier": tier_of(score),
        "country": doc.get("country"),
        "changes": (previous or {}).get("changes", 0) + 1,
        "source_seq": meta.seq,
    }


def on_delete(meta, options):
    if meta.id in scores:
        del scores[meta.id]
