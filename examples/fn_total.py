"""fn_total: one total per order in the `totals` bucket. An order without a price raises KeyError, so it
goes to the dead-letter queue (see docs/dlq-and-debugging.md); fn_total_fixed.py is the corrected handler."""


def on_update(doc, meta):
    totals[meta.id] = {"total": doc["qty"] * doc["price"]}
