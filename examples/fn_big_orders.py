def on_update(doc, meta):
    big[meta.id] = {"total": doc["total"], "customer": doc.get("customer")}


def on_delete(meta, options):
    # A delete has no document, so only the filter's key_prefix decides it: every order's delete comes here.
    if meta.id in big:
        del big[meta.id]
