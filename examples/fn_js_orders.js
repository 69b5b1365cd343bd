// A JavaScript handler (Couchbase's OnUpdate/OnDelete): keeps one summary per order in `dst`.
function OnUpdate(doc, meta) {
    if (doc.total === undefined) {
        log('order', meta.id, 'has no total; skipped');
        return;
    }
    dst['summary::' + meta.id] = {order: meta.id, total: doc.total, large: doc.total >= 100};
    couchbase.increment(dst, {id: 'orders::count'});
}

function OnDelete(meta, options) {
    delete dst['summary::' + meta.id];
}
