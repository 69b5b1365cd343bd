"""fn_call_log: a sandboxed handler that keeps a log of its calls in the folder an admin opened to it with
`sandbox_writable` (docs/functions.md, "Files a sandboxed handler keeps"). CALL_LOG is a constant."""


def on_update(doc, meta):
    with open(CALL_LOG, "a") as f:
        f.write(f"{meta.id} {meta.seq}\n")
