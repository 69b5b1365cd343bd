"""fn_total, corrected: an order without a price counts as free instead of failing."""


def on_update(doc, meta):
    totals[meta.id] = {"total": doc["qty"] * doc.get("price", 0)}
