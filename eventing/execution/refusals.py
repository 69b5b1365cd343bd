"""What a handler's error says when its sandbox refused what the handler tried: a file outside its folders,
a program, a connection to a host that is not a URL binding's (a PermissionError), or a module in a folder
the sandbox does not open (a ModuleNotFoundError). Its dead letter (or its deploy's error, for an import)
then names the sandbox and the fix, which matters most to a handler that ran unconfined before the sandbox
became the default."""

from __future__ import annotations

import errno

SANDBOXED = False  # set in a sandboxed child once it is confined (eventing.workers.sandbox.child)
HINT = (
    " (the sandbox may have refused it: a sandboxed handler reaches its bindings, curl() of its URL bindings "
    'and its private folder only; an admin can open a folder to it with "sandbox_writable", or deploy the '
    'function with "isolation": "none")'
)


IMPORT_HINT = (
    " (in the sandbox a handler imports from the interpreter's library and the package folders of its "
    "import path only, not from a checkout or a home folder: install the module into the environment, or "
    'an admin deploys the function with "isolation": "none")'
)


def refused_hint(exc: BaseException) -> str:
    """What to add to the error of `exc` raised in a sandboxed child: HINT for a PermissionError the system
    raised (EACCES, EPERM: a handler's own `raise PermissionError(...)` carries no errno), IMPORT_HINT for a
    module not found (its folder may be one the sandbox does not open); else ""."""
    if not SANDBOXED:
        return ""
    if isinstance(exc, PermissionError):
        return HINT if exc.errno in (errno.EACCES, errno.EPERM) else ""
    return IMPORT_HINT if isinstance(exc, ModuleNotFoundError) else ""
