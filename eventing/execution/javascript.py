"""JavaScript handlers on V8 (STPyV8), behind the same HandlerRunner as Python handlers.

`load_js_handler` runs a function's JavaScript source in a V8 context of its own (one per runner and thread
that calls it: one per worker, and one per pool thread with `concurrency` > 1; reused for every call) and
returns a module whose `on_update`, `on_delete`, `on_deploy` and one entry per top-level JavaScript function
(timer callbacks are looked up by name) are Python callables. The runner and the worker call them exactly as
they call a Python handler's functions, so per-document order, held binding writes, retries, dead letters, the
debugger and `dlq replay` are the same code.

What crosses between Python and V8 is JSON text: a call's arguments go in as one string the context parses,
and every binding access goes out through `__host` (JsHost), which calls the function's real BucketBinding,
TimerTable, CurlClient and log. Errors a host call hits come back as text and are thrown in JavaScript.

Limits, enforced inside V8 (STPyV8 exposes no isolate API for them, the V8 symbols of its extension do):
- execution_timeout: a watchdog thread calls v8::Isolate::TerminateExecution (thread-safe) once the call in
  flight passes its deadline; the call raises HandlerTimeout, and the context is used again by the next call.
- js_heap_limit_mb covers the V8 heap and the memory outside it that JavaScript holds (ArrayBuffers and typed
  arrays, V8's "external memory"): while a call runs JavaScript longer than a tick (not while it waits in a
  host call), the watchdog requests an interrupt in which V8's heap statistics are read on the JavaScript
  thread; past the limit the call is terminated and fails with JavaScriptMemoryError (a dead letter), and a
  full garbage collection follows. Every call is also checked when it returns (~0.7 us; ArrayBuffers of
  gigabytes are taken in microseconds, too fast for a tick): past the limit, garbage is collected, and a
  call that keeps more than the limit, or took more than the limit itself (garbage included), fails the
  same way (a batch fails at its last mutation, which is then retried alone). Dropped ArrayBuffers are
  collected once a quarter of the limit of them piled up (JsHandler._measure).
A call is always started from a compiled script (`script.run()`): STPyV8 aborts the process when a
terminated execution returns through its function-call path.

Batches: a worker hands a whole run of plain updates to `JsOnUpdate.batch` in one crossing (one JSON text
of the run's documents and metas); a JavaScript loop calls OnUpdate per mutation and stops at the first that
throws or is terminated, so the caller keeps per-mutation outcomes. A host call made inside the batch first
tells the caller which mutation is running (`on_start`), so binding writes stay grouped with their seqno.
The loop starts no mutation once `slice_s` has passed since the batch began, and the batch's deadline is
its start + slice_s + execution_timeout: a terminated mutation has run at least execution_timeout alone.

Threads: V8 contexts live in an isolate, and STPyV8 keeps the current isolate per thread (a thread without
one crashes the process on its first V8 call). A handler therefore has one context per thread that calls
it, created in that thread (with an isolate of the thread's own when it has none) by running the handler
source again; its global variables are per thread, as they are per worker. A worker's pool (`concurrency`
> 1) runs calls in several threads at once: each context has its own call in flight (`_Call`), which the
watchdog stops on its own isolate; STPyV8 lets other threads run while V8 does.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from eventing import handler as handler_api
from eventing.errors import HandlerLoadError
from eventing.execution.context import CallContext, HandlerTimeout
from eventing.execution.js_host import _as_json, _js_doc, _make_host
from eventing.execution.js_prelude import PRELUDE

ENTRY_POINTS = {"OnUpdate": "on_update", "OnDelete": "on_delete", "OnDeploy": "on_deploy"}
CALL, UPDATE, BATCH = 0, 1, 2  # the compiled scripts of a context: __call(), __update(), __batch()
BATCH_SLICE_S = 0.05  # a batch starts no mutation after this (or a tenth of execution_timeout)
WATCH_TICK_S = 0.005  # how often the watchdog looks at the call in flight
GC_EVERY_CALLS = 256  # how often a call checks the heap and collects garbage when it is half full


class _Call:
    """The call in flight in one thread's context, as the handler's watchdog sees it (under
    JsHandler.lock)."""

    __slots__ = (
        "isolate",
        "running",
        "stopped",
        "deadline",
        "started",
        "in_host",
        "memory",
        "external",
        "stats",
        "args",
        "base",
        "cc",
    )

    def __init__(self, isolate: int):
        self.isolate = isolate
        self.cc: CallContext | None = (
            None  # the runner's call, whose deadline moves while curl waits for a limit
        )
        self.running = False
        self.in_host = False  # in a host call (curl, a binding): no JavaScript runs, the heap does not grow
        self.stopped: str | None = None  # why it was terminated: timeout | memory
        self.deadline = 0.0
        self.started = 0.0
        self.base = 0  # what the isolate held before this context was made (other handlers' contexts)
        self.memory = 0  # the heap and ArrayBuffers after the last call (_V8.used_memory)
        self.external = 0  # the ArrayBuffers after the last garbage collection (JsHandler._measure)
        self.stats = (ctypes.c_size_t * 32)()  # v8::HeapStatistics, read on this context's thread only
        self.args = (ctypes.c_void_p(isolate), ctypes.byref(self.stats))  # made once: ~0.4 us a read saved


class _ThreadContext(NamedTuple):
    """A handler's V8 context in one thread, with its isolate, compiled scripts and call in flight."""

    thread: int
    ctx: Any
    isolate: int
    locals: Any
    call: Any
    update: Any
    batch: Any
    flight: _Call

    @property
    def scripts(self) -> tuple[Any, Any, Any]:
        return self.call, self.update, self.batch


class JavaScriptError(Exception):
    """A JavaScript handler threw: the message is JavaScript's `Name: message`, `js_stack` its stack."""

    def __init__(self, message: str, js_stack: str = ""):
        super().__init__(message)
        self.js_stack = js_stack

    @property
    def js_name(self) -> str:
        """The thrown error's name (`TypeError`, a class of the handler's own): what retry.non_retryable
        names; "" for a thrown value that is not an Error."""
        name, sep, _ = str(self).partition(": ")
        return name if sep and not name.startswith("Uncaught") and " " not in name else ""


class JavaScriptMemoryError(JavaScriptError):
    """A call's V8 heap and ArrayBuffers passed js_heap_limit_mb; it was terminated, or failed when it
    returned (`returned`: what the script returned then, else None)."""

    returned: int | None = None


# -- V8 through the symbols STPyV8's extension exports ---------------------------------------------------


class _V8:
    """v8::Isolate calls STPyV8 does not wrap: TerminateExecution (from another thread), heap statistics."""

    INTERRUPT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)

    def __init__(self) -> None:
        import _STPyV8  # type: ignore[import-not-found]

        lib = ctypes.CDLL(_STPyV8.__file__)
        self.current = lib._ZN2v87Isolate10GetCurrentEv
        self.current.restype = ctypes.c_void_p
        self.terminate = lib._ZN2v87Isolate18TerminateExecutionEv
        self.terminate.argtypes = [ctypes.c_void_p]
        self.cancel = lib._ZN2v87Isolate24CancelTerminateExecutionEv
        self.cancel.argtypes = [ctypes.c_void_p]
        self.heap_statistics = lib["_ZN2v87Isolate17GetHeapStatisticsEPNS_14HeapStatisticsE"]
        self.heap_statistics.restype = None  # called with ctypes objects only (_Call.args): no conversion
        self.low_memory = lib._ZN2v87Isolate21LowMemoryNotificationEv  # a full garbage collection
        self.low_memory.argtypes = [ctypes.c_void_p]
        self.request_interrupt = lib._ZN2v87Isolate16RequestInterruptEPFvPS0_PvES2_
        self.request_interrupt.argtypes = [ctypes.c_void_p, self.INTERRUPT, ctypes.c_void_p]
        self.on_interrupt = self.INTERRUPT(_heap_check)  # kept alive for V8
        self.zone_changed = (
            lib._ZN2v87Isolate39DateTimeConfigurationChangeNotificationENS0_17TimeZoneDetectionE
        )
        self.zone_changed.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.zones: dict[int, str | None] = {}  # isolate -> the TZ its dates were last set up for
        self.icu = _load_icu(lib)

    def used_memory(self, flight: _Call) -> int:
        """The used heap and external memory (ArrayBuffers' contents) of the isolate of `flight`, in bytes,
        beyond what it held before the context was made (an isolate is the thread's, shared by the contexts
        of every handler loaded in that thread, which V8 cannot measure apart cheaply): what
        js_heap_limit_mb limits. On that context's own thread (its statistics buffer)."""
        self.heap_statistics(*flight.args)
        stats = flight.stats
        return stats[4] + stats[7] - flight.base  # used_heap_size_, external_memory_

    def follow_time_zone(self, isolate: int) -> None:
        """Make the isolate's Date use the process's current time zone (the TZ variable, else the system's)
        when TZ changed since its dates were set up: V8 reads the zone once and caches it."""
        zone = os.environ.get("TZ")
        if self.zones.setdefault(isolate, zone) != zone:
            self.zones[isolate] = zone
            self.zone_changed(isolate, 1)  # v8::Isolate::TimeZoneDetection::kRedetect


def _load_icu(lib: Any) -> bool:
    """Load ICU's data into V8, the data Intl, toLocaleString, localeCompare and time zone names need.

    STPyV8 (13.1) passes V8 a dangling pointer for the path of its ICU data file, so V8 starts without ICU
    data: `toLocaleString()` then aborts the process (a fatal out-of-memory in ICU's date formatter),
    `localeCompare` throws, and local time ignores daylight saving time. V8 accepts the data once, later,
    as long as no JavaScript has used ICU yet: done here, before the first context is made."""
    import STPyV8

    initialize = lib._ZN2v82V813InitializeICUEPKc
    initialize.argtypes = [ctypes.c_char_p]
    initialize.restype = ctypes.c_bool
    candidates = [
        Path(folder) / "icudtl.dat" for folder in getattr(STPyV8, "icu_data_folders", None) or () if folder
    ]
    try:
        from importlib.resources import files

        candidates.insert(0, Path(str(files("stpyv8-icu") / "icudtl.dat")))
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    for path in candidates:
        if path.is_file():
            return bool(initialize(str(path).encode()))
    return False


_v8: _V8 | None = None
_thread = (
    threading.local()
)  # .entered: the context left entered after its last call in this thread (entering costs ~1 us a call)
_isolates: list[Any] = []  # isolates made for threads without one: kept for the process's life
# Every context made, kept for the process's life (~0.4 MB each): STPyV8 tracks the Python objects a context
# was given (its __host) with a weak callback that crashes the process (Context::Global on the dying
# context, STPyV8 13.1) when V8 collects the context, which happened in the next test after a handler
# was dropped. A context is made per handler load and thread.
_contexts: list[Any] = []
_encode = msgspec.json.Encoder().encode  # documents as JSON text: ~20x faster than json.dumps
_handlers: dict[int, JsHandler] = {}  # id -> handler, for the interrupt callback


def _engine() -> _V8:
    global _v8
    if _v8 is None:
        _v8 = _V8()
    return _v8


def _thread_isolate(STPyV8: Any) -> None:
    """Give the calling thread a V8 isolate when it has none (STPyV8 gives one to the thread importing it)."""
    if STPyV8.JSIsolate.current is None:
        isolate = STPyV8.JSIsolate()
        isolate.enter()
        _isolates.append(isolate)


def _heap_check(isolate: int | None, data: int | None) -> None:
    """Runs on the JavaScript thread, inside the running call (a V8 interrupt)."""
    h = _handlers.get(data or 0)
    here = h.contexts.get(threading.get_ident()) if h is not None else None
    if h is None or here is None or not here.flight.running or isolate is None:
        return
    assert _v8 is not None
    if _v8.used_memory(here.flight) > h.heap_limit:
        h._stop("memory", here.flight)


# -- refusals at deploy ------------------------------------------------------------------------------------

_UNSUPPORTED = [
    (re.compile(r"\bN1QL\s*\("), "SQL++ (N1QL())"),
    (
        re.compile(
            r"(?:^|[=(:,;{}?]|\breturn\b)\s*(?:SELECT|INSERT\s+INTO|UPSERT\s+INTO|DELETE\s+FROM|MERGE\s+INTO|"
            r"UPDATE\s+[A-Za-z_`][\w`.]*\s+(?:SET|UNSET|USE)\b)\s",
            re.IGNORECASE,
        ),
        "inline SQL++",
    ),
    (re.compile(r"\bcouchbase\s*\.\s*analyticsQuery\b"), "Analytics (couchbase.analyticsQuery())"),
]


def _code_only(source: str) -> str:
    """`source` with comments and the text of string literals blanked (newlines kept, so lines stay)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        nxt = source[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            while i < n and source[i] not in "\n\r\u2028\u2029":  # each ends it (ECMAScript's LineTerminator)
                out.append(" ")
                i += 1
        elif c == "/" and nxt == "*":
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.extend("\n" if ch == "\n" else " " for ch in source[i:end])
            i = end
        elif c in "'\"`":
            out.append(c)
            i += 1
            while i < n and source[i] != c:
                if source[i] == "\\" and i + 1 < n:
                    out.append("  ")
                    i += 2
                    continue
                out.append("\n" if source[i] == "\n" else " ")
                i += 1
            if i < n:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check_supported(function: str, source: str) -> None:
    """Refuse what this system does not run: SQL++ (N1QL() and inline statements), Analytics, XATTRs."""
    for lineno, line in enumerate(_code_only(source).splitlines(), start=1):
        for pattern, what in _UNSUPPORTED:
            if pattern.search(line):
                raise HandlerLoadError(
                    f"handler of function '{function}' line {lineno}: {what} is not supported; read and "
                    "write documents through bucket bindings (dst[key], couchbase.get/upsert/mutateIn) "
                    "instead"
                )


def compile_only(function: str, source: str) -> None:
    """V8 compiles the script without running any of it (saving a function runs none of its code); a
    syntax error is a HandlerLoadError naming its line."""
    try:
        import STPyV8
    except ImportError:
        raise HandlerLoadError(
            f"function '{function}' is a JavaScript handler and the V8 engine is not installed; pip install "
            "stpyv8"
        ) from None
    _thread_isolate(STPyV8)
    ctx = STPyV8.JSContext()
    with ctx:
        try:
            STPyV8.JSEngine().compile(source, f"{function}.js")
        except Exception as exc:  # noqa: BLE001 - STPyV8's SyntaxError
            raise _load_error(function, exc, "has a syntax error") from None


_JS_POSITION = re.compile(r"^(?P<message>.*?) \( (?P<name>.*?) @ (?P<line>\d+) : (?P<col>\d+) \)", re.DOTALL)


def _load_error(function: str, exc: Exception, what: str) -> HandlerLoadError:
    text = str(exc)
    m = _JS_POSITION.match(text)
    if m is None:
        return HandlerLoadError(
            f"handler of function '{function}' {what} ({text.splitlines()[0]}); fix the file and deploy again"
        )
    return HandlerLoadError(
        f"handler of function '{function}' {what} at line {m['line']}: {m['message']}; fix the file and "
        "deploy again"
    )


# -- the host object JavaScript calls ----------------------------------------------------------------------


def _plain_error(exc: BaseException) -> JavaScriptError:
    """An exception V8 raised past the prelude's catch (STPyV8's JSError, which holds V8 objects and cannot be
    pickled, so it must not leave this process: a Ray worker could not return it) as a JavaScriptError of
    strings."""
    try:
        name, message = str(getattr(exc, "name", "") or "Error"), str(getattr(exc, "message", "") or exc)
        stack = str(getattr(exc, "stackTrace", "") or "")
    except Exception:  # noqa: BLE001 - the text of an error that cannot be read
        name, message, stack = type(exc).__name__, "an error whose text cannot be read", ""
    return JavaScriptError(f"{name}: {message}", stack)


def _error(exc: BaseException) -> str:
    return "\0" + (str(exc) or type(exc).__name__)


class JsHandler:
    """One function's V8 context and the Python objects its JavaScript reaches."""

    def __init__(
        self,
        function: str,
        source: str,
        injected: Mapping[str, Any],
        context: CallContext | None,
        timeout_s: float,
        heap_limit_mb: int,
    ):
        import STPyV8  # type: ignore[import-not-found]

        from eventing.execution.bindings import BucketBinding
        from eventing.execution.curl import UrlBinding

        self.function = function
        self.call_context = context
        self.timeout_s = timeout_s
        self.heap_limit = heap_limit_mb * 1024 * 1024
        self.v8 = _engine()
        self.lock = threading.Lock()  # a call's start and end against its termination by the watchdog
        self.calls = 0
        self.closed = False
        self.watchdog: threading.Thread | None = None
        self.bindings: dict[str, Any] = {}
        self.url_bindings: dict[str, Any] = {}
        declarations = []
        for name, value in injected.items():
            if isinstance(value, BucketBinding) or type(value).__name__ == "_ImportTimeBinding":
                self.bindings[name] = value
                declarations.append(f"var {name} = __bucketMap({json.dumps(name)});")
            elif isinstance(value, UrlBinding):
                self.url_bindings[name] = value
                declarations.append(f"var {name} = __urlBinding({json.dumps(name)});")
            elif name in ("log", "curl", "create_timer", "cancel_timer"):
                continue
            else:
                declarations.append(f"var {name} = {json.dumps(value)};")
        self.log = injected.get("log", handler_api.log)
        self.curl_client = injected.get("curl")
        self.create_timer = injected.get("create_timer")
        self.cancel_timer = injected.get("cancel_timer")
        self.host = _make_host(STPyV8, self)
        self.source = source
        self.declarations = "\n".join(declarations)
        self.slice_s = min(BATCH_SLICE_S, timeout_s / 10)  # see the module docstring, "Batches"
        self.key_base = b""  # meta.idempotency_key's (eventing.core.idempotency), set by the runner
        self.on_start: Any = None  # the batch in flight's callback (see batch)
        self.batch_at = 0
        self.module = types.ModuleType(f"eventing_handler_{function}")
        self.contexts: dict[int, _ThreadContext] = {}
        self.here, functions = self._new_context(STPyV8, True)
        for name in functions:
            self.module.__dict__[name] = JsFunction(self, name)
        for js_name, py_name in ENTRY_POINTS.items():
            if js_name in functions:
                self.module.__dict__[py_name] = (
                    JsOnUpdate(self) if js_name == "OnUpdate" else self.module.__dict__[js_name]
                )
        self.module.__dict__["__js_handler__"] = self
        _handlers[id(self)] = self

    def _new_context(self, STPyV8: Any, first: bool) -> tuple[_ThreadContext, list[str]]:
        """A context for the calling thread with the prelude, the bindings and the handler source run in it;
        and the handler's top-level functions."""
        _thread_isolate(STPyV8)
        ctx = STPyV8.JSContext()
        _contexts.append(ctx)
        with ctx:
            isolate = self.v8.current()
            flight = _Call(isolate)
            flight.base = self.v8.used_memory(flight)
            self.v8.follow_time_zone(isolate)
            setattr(ctx.locals, "__host", self.host)  # (a dunder name, mangled as an attribute)
            ctx.eval(PRELUDE, "<eventing prelude>")
            ctx.eval(self.declarations, "<eventing bindings>")
            before = set(ctx.eval("Object.getOwnPropertyNames(globalThis).join('\\n')").split("\n"))
            try:
                ctx.eval(self.source, f"{self.function}.js")
            except Exception as exc:  # noqa: BLE001 - STPyV8's JSError (syntax error or a throw at load)
                kind = "has a syntax error" if str(exc).startswith("SyntaxError") else "fails on load"
                if not first:
                    kind += " in a new thread"
                raise _load_error(self.function, exc, kind) from None
            names = ctx.eval(
                "Object.getOwnPropertyNames(globalThis).filter(function (n) { return typeof globalThis[n] === 'function'; }).join('\\n')"  # noqa: E501
            ).split("\n")
            engine = STPyV8.JSEngine()
            # Kept with the context: a compiled script refers to its engine without holding it, and a run
            # that V8 terminated reads the engine's isolate (freed, that crashed the process or garbled the
            # call's error).
            _contexts.append(engine)
            scripts = engine.compile("__call()"), engine.compile("__update()"), engine.compile("__batch()")
        here = _ThreadContext(threading.get_ident(), ctx, isolate, ctx.locals, *scripts, flight)
        self.contexts[here.thread] = here
        return here, [n for n in names if n and n not in before]

    def context_here(self) -> _ThreadContext:
        """The context of the calling thread, created on its first call (see the module docstring)."""
        here = self.contexts.get(threading.get_ident())
        if here is None:
            import STPyV8

            here = self._new_context(STPyV8, False)[0]
        if threading.current_thread() is threading.main_thread() or len(self.contexts) == 1:
            self.here = here  # a pool thread's (concurrency > 1) is looked up on each call instead
        return here

    # -- calls --------------------------------------------------------------------------------------------

    def run(self, which: int, text: str, count: int = 1) -> int:
        """Run the script `which` (CALL, UPDATE, BATCH) of the calling thread's context with `__in` = text and
        return what it returned; raise HandlerTimeout or JavaScriptMemoryError when the call was stopped,
        JavaScriptError when CALL or UPDATE threw."""
        cc = self.call_context.here() if self.call_context is not None else None  # a pool thread's own
        thrown: JavaScriptError | None = None
        now = time.monotonic()
        deadline = cc.deadline if cc is not None and cc.active else now + self.timeout_s
        here = self.here
        if here.thread != threading.get_ident():
            here = self.context_here()
        flight = here.flight
        ctx = here.ctx
        entered = getattr(_thread, "entered", None)
        if entered is not ctx:  # another handler's context was left entered in this thread: switch
            if entered is not None:
                entered.leave()
            _thread.entered = None
            ctx.enter()
            _thread.entered = ctx
        try:
            with self.lock:
                flight.stopped, flight.in_host = None, False
                flight.deadline, flight.started, flight.running = deadline, now, True
                flight.cc = cc if cc is not None and cc.active else None
                if self.watchdog is None:
                    self._start_watchdog()
            setattr(here.locals, "__in", text)
            try:
                rc = here.scripts[which].run()
            except Exception as exc:  # noqa: BLE001 - thrown past the prelude's catch: made a plain error
                rc, thrown = 1, _plain_error(exc)
        finally:
            with self.lock:
                flight.running = False
                stopped = flight.stopped
            if stopped is not None:
                self.v8.cancel(here.isolate)
        self.calls += count
        if thrown is not None and stopped is None:
            self._measure(here, flight, None, count)
            raise thrown
        if stopped == "memory":
            self._collect(here.isolate)
            flight.memory, flight.external = self.v8.used_memory(flight), flight.stats[7]
            raise self._memory_error("the call was stopped")
        if stopped == "timeout":
            self._measure(here, flight, None, count)  # what the next call starts from
            raise HandlerTimeout()
        if which != BATCH and rc != 0:
            error = self._thrown(here)
            self._measure(here, flight, None, count)
            raise error
        self._measure(here, flight, rc if which != BATCH or rc >= 0 else None, count)
        return rc

    def _measure(self, here: _ThreadContext, flight: _Call, returned: int | None, count: int) -> None:
        """After a call (`returned`: what it returned; None when it failed already, which is then not
        failed again): past js_heap_limit_mb, collect garbage and fail the call if it keeps more than the
        limit, or took more than the limit by itself; otherwise collect garbage when ArrayBuffers of a quarter
        of the limit have been dropped since the last collection (V8 frees them late: a call would start with
        them and be stopped for them), or, every GC_EVERY_CALLS calls, when the heap is half full."""
        used = self.v8.used_memory(flight)
        if used > self.heap_limit:  # taken faster than the watchdog looks (large ArrayBuffers at once)
            self._collect(here.isolate)
            before, flight.memory = flight.memory, self.v8.used_memory(flight)
            flight.external = flight.stats[7]
            # Still past it (kept), or past it by what this call alone took (garbage of earlier calls aside).
            if (flight.memory > self.heap_limit or used - before > self.heap_limit) and returned is not None:
                error = self._memory_error("the call failed when it returned")
                error.returned = returned
                raise error
            return
        external = flight.stats[7]
        if external - flight.external > self.heap_limit // 4 or (
            self.calls % GC_EVERY_CALLS < count and used > self.heap_limit // 2
        ):
            self._collect(here.isolate)
            used, external = self.v8.used_memory(flight), flight.stats[7]
            flight.external = external
        flight.memory, flight.external = used, min(flight.external, external)

    def _memory_error(self, what: str) -> JavaScriptMemoryError:
        return JavaScriptMemoryError(
            f"RangeError: the JavaScript heap and its ArrayBuffers passed js_heap_limit_mb "
            f"({self.heap_limit >> 20} MiB); {what}"
        )

    def _thrown(self, here: _ThreadContext) -> JavaScriptError:
        message, stack = json.loads(getattr(here.locals, "__err"))
        return JavaScriptError(message, stack)

    def invoke(self, name: str, args: tuple) -> None:
        self.run(CALL, json.dumps([name, *(_as_json(a) for a in args)]))

    def batch(self, text: str, count: int, on_start: Any) -> tuple[int, BaseException | None]:
        """Run OnUpdate over a batch (see JsOnUpdate.batch): (how many returned, the failure of the next or
        None). `on_start(i)` is called before a host call made by the batch's mutation i when the last one
        reported was another; the mutations between them made no host call."""
        self.on_start, self.batch_at = on_start, 0
        try:
            rc = self.run(BATCH, text, count)
        except JavaScriptMemoryError as exc:
            if exc.returned is not None:  # over the limit when the batch returned: its last mutation fails
                return max(0, int(exc.returned) - 1), exc
            return int(getattr(self.here.locals, "__idx")), exc
        except (HandlerTimeout, JavaScriptError) as exc:  # JavaScriptError: thrown past the batch's catch
            return int(getattr(self.here.locals, "__idx")), exc
        finally:
            self.on_start = None
        if rc < 0:
            return -1 - int(rc), self._thrown(self.here)
        return int(rc), None

    def _collect(self, isolate: int) -> None:
        self.v8.low_memory(isolate)

    def _stop(self, why: str, flight: _Call, deadline: float | None = None) -> None:
        """Terminate a call in flight (from the watchdog thread, or a host call or an interrupt on the call's
        own thread); with `deadline`, only the call that has it (not the next call of the same thread)."""
        with self.lock:
            if (
                flight.running
                and flight.stopped is None
                and (deadline is None or flight.deadline == deadline)
            ):
                flight.stopped = why
                self.v8.terminate(flight.isolate)

    def _start_watchdog(self) -> None:
        self.watchdog = threading.Thread(target=self._watch, name=f"js-watchdog-{self.function}", daemon=True)
        self.watchdog.start()

    def _watch(self) -> None:
        v8 = self.v8
        while not self.closed:
            time.sleep(WATCH_TICK_S)
            now = time.monotonic()
            for here in list(self.contexts.values()):  # a context per thread that calls the handler
                flight = here.flight
                if not flight.running:
                    continue
                deadline = flight.deadline
                cc = flight.cc
                if cc is not None and cc.deadline > deadline:  # curl waited for a URL binding's limit
                    with self.lock:
                        if flight.running and flight.cc is cc:
                            flight.deadline = deadline = cc.deadline
                if now >= deadline:
                    self._stop("timeout", flight, deadline)
                elif now - flight.started >= WATCH_TICK_S and not flight.in_host:
                    v8.request_interrupt(flight.isolate, v8.on_interrupt, id(self))

    def close(self) -> None:
        self.closed = True
        _handlers.pop(id(self), None)
        here = self.contexts.get(threading.get_ident())
        entered = getattr(_thread, "entered", None)
        if here is not None and entered is here.ctx:
            entered.leave()
            _thread.entered = None

    # -- host calls (from JavaScript, on the JavaScript thread) -------------------------------------------

    def guarded(self, fn: Any, *args: Any) -> Any:
        """A host call: its errors become text JavaScript throws; a timeout signalled inside it (the worker's
        SIGALRM watchdog, or a pool's watcher) terminates the call, so no JavaScript catch can swallow it.
        Inside a batch it first reports which mutation is running when that changed."""
        here = self.contexts.get(threading.get_ident())
        if here is not None:
            here.flight.in_host = True
        try:
            if self.on_start is not None:
                at = int(getattr((here or self.here).locals, "__idx"))
                if at != self.batch_at:
                    self.batch_at = at
                    self.on_start(at)
            return fn(*args)
        except HandlerTimeout:
            if here is not None:
                self._stop("timeout", here.flight)
            return "\0execution_timeout"
        except Exception as exc:  # noqa: BLE001 - thrown in JavaScript as an Error with this message
            return _error(exc)
        finally:
            if here is not None:
                here.flight.in_host = False

    def binding(self, alias: str) -> Any:
        b = self.bindings.get(alias)
        if b is None:
            raise HandlerLoadError(f"'{alias}' is not a bucket binding of function '{self.function}'")
        return b


class JsFunction:
    """A top-level JavaScript function as a Python callable (entry points and timer callbacks)."""

    __slots__ = ("__name__", "handler")

    def __init__(self, handler: JsHandler, name: str):
        self.handler = handler
        self.__name__ = name

    def __call__(self, *args: Any) -> None:
        self.handler.invoke(self.__name__, args)

    def __repr__(self) -> str:
        return f"<JavaScript function {self.__name__}>"


class JsOnUpdate(JsFunction):
    """OnUpdate(doc, meta, xattrs): the hot path; the meta is written as JSON text directly. Its third
    argument is always given, as Couchbase gives it: the document's user extended attributes, `{}` when it
    has none (the fast paths pass `{}` themselves)."""

    __slots__ = ("keyspaces",)
    takes_xattrs = True  # eventing.execution.loader.takes_xattrs

    def __init__(self, handler: JsHandler):
        super().__init__(handler, "OnUpdate")
        self.keyspaces: dict[int, tuple[dict, str]] = {}

    def __call__(self, doc: Any, meta: Any = None, *rest: Any) -> None:
        from eventing.handler import Meta

        if rest and len(rest) == 1 and rest[0] == {}:
            rest = ()  # no extended attributes: what the fast paths give
        if type(doc) is bytes:  # a binary document, or a JSON value other than an object
            value, datatype = _js_doc(doc)
            args = [_as_json(a) for a in (meta, *rest)]
            if isinstance(args[0], dict):
                args[0]["datatype"] = datatype
            self.handler.run(CALL, json.dumps(["OnUpdate", value, *args]))
            return
        if not isinstance(meta, Meta) or rest or meta.previous is not None:
            self.handler.invoke("OnUpdate", (doc, meta, *rest))
            return
        ks = meta.keyspace
        cached = self.keyspaces.get(id(ks))
        if cached is None or cached[0] is not ks:
            cached = self.keyspaces[id(ks)] = (ks, json.dumps(ks))
        text = (
            f'[{_encode(doc).decode()},{{"cas":"{meta.cas}","id":{_encode(meta.id).decode()},"expiration":'
            f'{meta.expiration},"flags":{meta.flags},"vb":{meta.vb},"seq":{meta.seq},"datatype":"json",'
            f'"keyspace":{cached[1]}}}]'
        )
        self.handler.run(UPDATE, text)

    def batch(
        self, rows: list, docs: list, keyspace: dict, on_start: Any
    ) -> tuple[int, BaseException | None]:
        """OnUpdate (OnDelete for a deletion) over a run of one vBucket's plain mutations in one crossing:
        `rows` are their log rows (Mutation's field order), `docs` their decoded documents (None: deleted).
        Returns how many returned in order, and the failure (JavaScriptError, HandlerTimeout,
        JavaScriptMemoryError) of the next one, or None when the batch stopped at its time slice with the
        rest not started. `on_start(i)`: see JsHandler.batch."""
        vb, ops = rows[0][0], [r[3] for r in rows]
        binary = any(type(d) is bytes for d in docs)
        if binary:  # see JsOnUpdate.__call__
            docs = [None if d is None else _js_doc(d)[0] for d in docs]
        text = _encode(
            [
                docs,
                [r[2] for r in rows],
                [str(r[4]) for r in rows],
                [r[7] for r in rows],
                [r[8] for r in rows],
                [r[1] for r in rows],
                vb,
                keyspace,
                self.handler.slice_s * 1000,
                binary,
                ops if any(ops) else None,
            ]
        ).decode()
        return self.handler.batch(text, len(rows), on_start)


def load_js_handler(
    function: str,
    source: str,
    injected: Mapping[str, Any],
    *,
    context: CallContext | None = None,
    timeout_s: float = 60.0,
    heap_limit_mb: int = 128,
    windowed: bool = False,
) -> types.ModuleType:
    """The handler as a module (see the module docstring). Raises HandlerLoadError with the line for a
    syntax error, a throw at load, SQL++/Analytics/XATTRs, or neither OnUpdate nor OnDelete."""
    check_supported(function, source)
    try:
        import STPyV8  # noqa: F401
    except ImportError:
        raise HandlerLoadError(
            f"function '{function}' is a JavaScript handler and the V8 engine is not installed; pip install "
            "stpyv8"
        ) from None
    handler = JsHandler(function, source, injected, context, timeout_s, heap_limit_mb)
    module = handler.module
    if "on_update" not in module.__dict__ and "on_delete" not in module.__dict__ and not windowed:
        handler.close()
        raise HandlerLoadError(
            f"handler of function '{function}' defines neither OnUpdate(doc, meta) nor OnDelete(meta, "
            "options); define at least one"
        )
    return module
