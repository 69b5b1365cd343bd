"""Loads a function's handler source (stored in the metadata store at deploy) into a fresh module."""

from __future__ import annotations

import functools
import inspect
import traceback
import types
from collections.abc import Mapping
from typing import Any

from eventing import handler as handler_api
from eventing.errors import HandlerLoadError
from eventing.execution.refusals import refused_hint


@functools.lru_cache(maxsize=32)
def _compiled(source: str, filename: str) -> types.CodeType:
    """The handler's code object, compiled once per source in a process (a code object is never changed by
    running it): every worker of a function, and every restart of one, loads the same source again."""
    return compile(source, filename, "exec")


def load_handler(
    function: str,
    source: str,
    injected: Mapping[str, Any],
    *,
    windowed: bool = False,
    language: str = "python",
    context: Any = None,
    timeout_s: float = 60.0,
    heap_limit_mb: int = 128,
) -> types.ModuleType:
    """Execute the handler source with bindings, constants and `log` as globals.

    Raises HandlerLoadError if it does not import or defines neither on_update nor on_delete. A JavaScript
    handler (language "javascript") runs in a V8 context of its own (eventing.execution.javascript); its
    module has the same entry points as a Python handler's.
    """
    if language == "javascript":
        from eventing.execution.javascript import load_js_handler

        return load_js_handler(
            function,
            source,
            injected,
            context=context,
            timeout_s=timeout_s,
            heap_limit_mb=heap_limit_mb,
            windowed=windowed,
        )
    module = types.ModuleType(f"eventing_handler_{function}")
    helpers = {
        name: getattr(handler_api, name)
        for name in ("crc64", "crc_64_go_iso", "base64_encode", "base64_decode")
    }
    module.__dict__.update({"log": handler_api.log, **helpers, **injected})
    filename = f"<handler of {function}>"
    try:
        code = _compiled(source, filename)
        exec(code, module.__dict__)
        # `from eventing.handler import create_timer` binds the import-time stand-in over the injected
        # function; put the injected one back.
        for name, value in injected.items():
            if name in module.__dict__ and module.__dict__[name] is getattr(handler_api, name, None):
                module.__dict__[name] = value
    except SyntaxError as exc:
        raise HandlerLoadError(
            f"handler of function '{function}' has a syntax error at line {exc.lineno}: {exc.msg}; "
            "fix the file and deploy again"
        ) from None
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise HandlerLoadError(
            f"handler of function '{function}' fails on import ({type(exc).__name__}: {exc}, "
            f"line {where.lineno}){refused_hint(exc)}; fix the file and deploy again"
        ) from None
    on_update = module.__dict__.get("on_update")
    on_delete = module.__dict__.get("on_delete")
    on_batch = module.__dict__.get("on_batch")
    if on_update is None and on_delete is None and on_batch is None and not windowed:
        raise HandlerLoadError(
            f"handler of function '{function}' defines neither on_update(doc, meta) nor on_delete(meta, "
            "options); define at least one (or on_batch(batch))"
        )
    check_batch_entry(
        function,
        on_batch is not None,
        on_update is not None or on_delete is not None,
        "a window" if windowed else None,
    )
    for name, fn in (
        ("on_update", on_update),
        ("on_delete", on_delete),
        ("on_deploy", module.__dict__.get("on_deploy")),
        ("on_batch", on_batch),
    ):
        if fn is not None:
            _check_entry_point(function, name, fn)
    return module


_ENTRY_POINTS = {
    "on_update": ("doc", "meta"),
    "on_delete": ("meta", "options"),
    "on_deploy": ("action",),
    "on_batch": ("batch",),
}


def check_batch_entry(function: str, has_batch: bool, has_per_call: bool, refused_by: str | None) -> None:
    """on_batch(batch) replaces on_update and on_delete (one or the other), and takes no setting that follows
    the log one mutation at a time (`refused_by`: a window, previous_version, concurrency > 1)."""
    if not has_batch:
        return
    if has_per_call:
        raise HandlerLoadError(
            f"handler of function '{function}' defines on_batch(batch) and on_update/on_delete; define "
            "on_batch alone (it gets updates and deletes) or remove it"
        )
    if refused_by:
        raise HandlerLoadError(
            f"handler of function '{function}' defines on_batch(batch), which {refused_by} does not take; "
            "use on_update/on_delete, or remove that setting"
        )


def _check_entry_point(function: str, name: str, fn: Any) -> None:
    """Entry points are called with their positional arguments (on_update(doc, meta), on_delete(meta,
    options), on_deploy(action)): refuse anything else at deploy, not with a dead letter per mutation."""
    params = ", ".join(_ENTRY_POINTS[name])
    if not callable(fn):
        raise HandlerLoadError(
            f"handler of function '{function}': {name} is a {type(fn).__name__}, not a function; "
            f"define it as def {name}({params}):"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or extension without a signature: it answers for itself at the first call
    try:
        signature.bind(*[None] * len(_ENTRY_POINTS[name]))
    except TypeError:
        if name == "on_update" and takes_xattrs(fn):
            return  # on_update(doc, meta, xattrs)
        raise HandlerLoadError(
            f"handler of function '{function}': {name}{signature} cannot be called as {name}({params}); "
            f"define it as def {name}({params}):"
        ) from None


def takes_xattrs(fn: Any) -> bool:
    """Whether an on_update is called with a third argument, the document's user extended attributes
    (Couchbase 7.6's OnUpdate(doc, meta, xattrs)): one that takes three positional arguments, or a JavaScript
    handler's whose OnUpdate declares three parameters (its `takes_xattrs`)."""
    if fn is None:
        return False
    marked = getattr(fn, "takes_xattrs", None)
    if marked is not None:
        return bool(marked)
    try:
        inspect.signature(fn).bind(None, None, None)
    except (TypeError, ValueError):
        return False
    return True


class _ImportTimeBinding:
    """Stands in for a binding while a handler is validated at deploy: using it at import is an error."""

    def __init__(self, alias: str):
        self._alias = alias

    def __getattr__(self, name: str):
        raise HandlerLoadError(
            f"binding '{self._alias}' is used at import time; use it inside on_update/on_delete"
        )

    __getitem__ = __setitem__ = __delitem__ = __contains__ = __getattr__


def validate_handler(
    function: str,
    source: str,
    aliases: list[str],
    constants: Mapping[str, Any],
    *,
    windowed: bool = False,
    language: str = "python",
) -> None:
    """A windowed function may define neither entry point: its window does the work."""
    module = load_handler(
        function,
        source,
        {**{a: _ImportTimeBinding(a) for a in aliases}, **constants},
        windowed=windowed,
        language=language,
    )
    closer = module.__dict__.get("__js_handler__")
    if closer is not None:
        closer.close()
