"""fn_email: keeps one welcome e-mail draft per customer in the `emails` bucket.

Every customer update rewrites the draft (so it always shows the latest name and address);
a deleted or expired customer loses its draft. `emails` is bound read-write as `dst`.
"""


def on_update(doc, meta):
    email = doc.get("email")
    if not email:
        log("customer", meta.id, "has no e-mail address; no draft")
        return
    dst[meta.id] = {
        "to": email,
        "subject": f"Welcome back, {doc.get('name', 'customer')}",
        "domain": email.rsplit("@", 1)[-1],
        "customer_rev": doc.get("rev"),
        "source_seq": meta.seq,
    }


def on_delete(meta, options):
    if meta.id in dst:
        del dst[meta.id]
