"""Every document written to any collection of the shop bucket (source `shop.*.*`), noted in the shop_feed
bucket under its keyspace: docs/everyday-commands.md, 'Scopes and collections'."""


def on_update(doc, meta):
    ks = meta.keyspace  # the collection the mutation came from (bucket_name, scope_name, collection_name)
    feed[f"{ks['scope_name']}.{ks['collection_name']}::{meta.id}"] = {"keyspace": ks, "doc": doc}
