"""fn_orders: one total per order of the collection shop.sales.orders, written to shop.sales.totals under
the order's key (docs/everyday-commands.md, 'Scopes and collections'). An order without a price gets no
total; a deleted order loses its total."""


def on_update(
    doc, meta
):  # meta.keyspace: {"bucket_name": "shop", "scope_name": "sales", "collection_name": "orders"}
    if "price" in doc:
        totals[meta.id] = {"total": doc["qty"] * doc["price"], "collection": meta.keyspace["collection_name"]}


def on_delete(meta, options):
    if meta.id in totals:
        del totals[meta.id]
