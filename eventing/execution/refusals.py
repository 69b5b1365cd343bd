"""What a handler's error says when its sandbox refused what the handler tried: a file outside its folders,
a program, a connection to a host that is not a URL binding's. The refusal reaches the handler as a
PermissionError; its dead letter (or its deploy's error, for an import) then names the sandbox and the
fix, which matters most to a handler that ran unconfined before the sandbox became the default."""

from __future__ import annotations

SANDBOXED = False  # set in a sandboxed child once it is confined (eventing.workers.sandbox.child)
HINT = (
    " (refused by the sandbox: a sandboxed handler reaches its bindings, curl() of its URL bindings and its "
    'private folder only; an admin can open a folder to it with "sandbox_writable", or deploy the function '
    'with "isolation": "none")'
)


def refused_hint(exc: BaseException) -> str:
    """HINT for a PermissionError raised in a sandboxed child, else ""."""
    return HINT if SANDBOXED and isinstance(exc, PermissionError) else ""
