"""The traceback a dead letter keeps of a handler's error: from the handler's own frame on (the worker's
frames that called it say nothing to its author), with the causes the handler chained (`raise ... from`,
an error raised while it handled another); the runner unchains an earlier attempt's error, which the letter
lists under `Attempts:` (eventing.execution.runner.Tried)."""

from __future__ import annotations

import traceback

HANDLER_FILE = "<handler of "  # the file name a handler's module is compiled with (eventing.execution.loader)


def handler_traceback(exc: BaseException) -> str:
    """`exc`'s traceback from the first frame of the handler's module, with its chained errors; the whole
    traceback when no frame is the handler's (an error before or around the call)."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(HANDLER_FILE):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def error_text(exc: BaseException) -> str:
    """The one line a dead letter gives a handler's error: `Type: message`; a JavaScript error's own
    `Name: message` (TypeError, a class of the handler's), as Couchbase shows it."""
    if getattr(exc, "js_stack", None) is not None:  # eventing.execution.javascript.JavaScriptError
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
