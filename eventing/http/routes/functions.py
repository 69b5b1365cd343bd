"""The endpoints of functions and their lifecycle, in Couchbase Eventing's shapes: list, read, save and
delete a function (in this project's format or Couchbase's, `?format=couchbase`), its settings and
handler source (`/appcode`), import and export, and deploy, pause, resume and undeploy (`?wait=`). Each
calls eventing.control.lifecycle, as the CLI does. `list_functions` and `get_function` are also what the
status and Couchbase-only endpoints read functions with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response

from eventing.control import lifecycle
from eventing.core import couchbase_format
from eventing.core.definition import FunctionDefinition, check_function_name
from eventing.core.function_names import plain_name
from eventing.core.secrets import mask_definition
from eventing.errors import ConfigError, NotFoundError, fix
from eventing.http import function_access
from eventing.http.routes.request import (
    AlreadyInState,
    EndpointRequest,
    _couchbase_call,
    _with_warnings,
    resolve_name,
)
from eventing.ops import stats

DEFAULT_WAIT_S = 60.0  # ?wait= of pause and undeploy: how long to wait for the running service


# -- functions (Couchbase-shaped) --------------------------------------------------------------------


def _document(record: Any) -> dict[str, Any]:
    """A stored function as every role reads it: URL binding secrets masked (`*****`)."""
    return {
        **mask_definition(record.definition),
        "handler_source": record.source,
        "state": record.state.value,
        "generation": record.generation,
    }


def list_functions(c: EndpointRequest) -> list[dict[str, Any]]:
    """Every function in this project's shape (what the other endpoints read functions with)."""
    try:
        store = c.state.metadata
    except NotFoundError:
        return []
    try:
        return [_document(r) for r in store.list_functions()]
    finally:
        store.close()


def list_functions_endpoint(c: EndpointRequest) -> list[dict[str, Any]] | Response:
    """GET /api/v1/functions: Couchbase's function JSON of every function (a Python function, which that
    shape cannot carry, is listed in this project's shape and named in the warnings header);
    `?format=eventing`: this project's shape for every one."""
    if not _couchbase_format(c):
        return list_functions(c)

    def run() -> Response:
        out, warnings = [], []
        for f in list_functions(c):
            if f.get("language", "python") != "javascript":  # listed as GET NAME shows it, not left out
                out.append(f)
                warnings.append(PYTHON_SHAPE.format(name=f["name"]))
                continue
            try:
                exported, more = lifecycle.export_couchbase(c.state, f["name"])
            except ConfigError as exc:
                warnings.append(str(exc))
                continue
            out.append(exported)
            warnings.extend(more)
        return _with_warnings(out, warnings)

    return _couchbase_call(run)


def stored_function(c: EndpointRequest) -> dict[str, Any]:
    """The function the request names, in this project's shape."""
    with c.state.metadata as store:
        return _document(store.get_function(c.name))


PYTHON_SHAPE = (
    "function '{name}' has a Python handler, which Couchbase's function JSON cannot carry; it is "
    "shown in this project's shape (?format=eventing)"
)


def get_function(c: EndpointRequest) -> dict[str, Any] | Response:
    """Couchbase's function JSON (errors in its shape); `?format=eventing`, and a Python function (which
    that JSON cannot carry, named in the warnings header): this project's shape."""
    if _couchbase_format(c):
        doc = stored_function(c)
        if doc.get("language", "python") != "javascript":
            return _with_warnings(doc, [PYTHON_SHAPE.format(name=c.name)])
        return _couchbase_call(lambda: _with_warnings(*lifecycle.export_couchbase(c.state, c.name)))
    return stored_function(c)


def _couchbase_format(c: EndpointRequest, default: str = "couchbase") -> bool:
    fmt = c.query.get("format", default)
    if fmt not in ("eventing", "couchbase"):
        raise ConfigError(
            f"format={fmt} is not valid; use format=couchbase or format=eventing "
            f"(the default here: {default})"
        )
    return fmt == "couchbase"


def save_function(c: EndpointRequest) -> dict[str, Any] | Response:
    """The body is a definition as `eventing export` writes it (`appcode` is accepted for `handler_source`),
    or Couchbase's function JSON (then its deployment_status/processing_status are carried out)."""
    body = c.json_object()
    if couchbase_format.is_couchbase_function(body):
        return _couchbase_call(lambda: _save_couchbase(c, body))
    if "appcode" in body and "handler_source" not in body:
        body["handler_source"] = body.pop("appcode")
    if body.get("name", c.name) != c.name:
        raise ConfigError(
            f"the body names function {body['name']!r} but the URL names '{c.name}'; make them agree"
        )
    _drop_read_only(c, body)
    source = body.get("handler_source")
    if not isinstance(source, str):
        raise ConfigError("the body needs 'handler_source': the handler's Python code as a string")
    defn = FunctionDefinition.from_dict({**body, "name": c.name})
    return stats.function_view(lifecycle.save_function(c.state, defn, source, saved_by=c.identity))


def _save_couchbase(c: EndpointRequest, body: dict[str, Any]) -> Response:
    if body.get("appname", c.name) != c.name:
        raise ConfigError(
            f"the body names function {body['appname']!r} but the URL names '{c.name}'; make them agree"
        )
    records, warnings = lifecycle.import_functions(
        c.state, {**body, "appname": c.name}, deploying=_deploying(c), saved_by=c.identity
    )
    return _with_warnings({**stats.function_view(records[0]), "warnings": warnings}, warnings)


def _deploying(c: EndpointRequest) -> Callable[[str], Any]:
    return lambda name: function_access.deploying_as(c.state, name, c.identity)


def create_functions(c: EndpointRequest) -> Response:
    """POST /api/v1/functions: one function or a list, in Couchbase's format or this project's (as import)."""

    def run() -> Response:
        records, warnings = lifecycle.import_functions(
            c.state, c.json(), deploying=_deploying(c), saved_by=c.identity
        )
        return _with_warnings(
            {"functions": [stats.function_view(r) for r in records], "warnings": warnings}, warnings
        )

    return _couchbase_call(run)


def delete_function(c: EndpointRequest) -> dict[str, Any]:
    lifecycle.delete(c.state, c.name)
    return {"name": c.name, "deleted": True}


def _refuse_again(c: EndpointRequest, state: str) -> None:
    """A deploy of a deployed function, or an undeploy of an undeployed one: Couchbase's "already in that
    state" (eventing.http.routes.request.AlreadyInState), which its tools take as done."""
    with c.state.metadata as store:
        now = store.get_function(c.name).state.value
    if now == state:
        action = "deploy" if state == "deployed" else "undeploy"
        raise AlreadyInState(
            plain_name(c.name),
            state,
            f"function '{c.name}' is already {state}; nothing to {action}; see {{fix}}",
            fix=fix("status"),
        )


def deploy(c: EndpointRequest) -> dict[str, Any]:
    body = c.json_object()
    boundary = body.get("boundary")
    if boundary not in (None, "everything", "from_now"):
        raise ConfigError(f"boundary {boundary!r} is not valid; use 'everything' or 'from_now'")
    if boundary is None and "dcp_stream_boundary" in body:  # Couchbase's deploy body: its settings
        fields, _, _ = couchbase_format.settings_from_couchbase(
            c.name, {"dcp_stream_boundary": body["dcp_stream_boundary"]}
        )
        boundary = fields["boundary"]
    _refuse_again(c, "deployed")
    with function_access.deploying_as(c.state, c.name, c.identity):  # a non-admin's handler runs sandboxed
        return stats.function_view(lifecycle.deploy(c.state, c.name, boundary))


def _wait_s(c: EndpointRequest) -> float:
    """?wait=SECONDS, checked before the function's state is (a bad parameter is a 400 in every state)."""
    text = c.query.get("wait", "").strip()
    if not text:
        return DEFAULT_WAIT_S
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not math.isfinite(wait) or wait < 0:
        raise ConfigError(
            f"wait={c.query['wait']} is not valid; give a number of seconds >= 0 (default {DEFAULT_WAIT_S:g})"
        )
    return wait


def pause(c: EndpointRequest) -> dict[str, Any]:
    return stats.function_view(lifecycle.pause(c.state, c.name, wait_s=_wait_s(c)))


def resume(c: EndpointRequest) -> dict[str, Any]:
    with function_access.deploying_as(c.state, c.name, c.identity):
        return stats.function_view(lifecycle.resume(c.state, c.name))


READ_ONLY = ("state", "generation")  # what a GET adds to a definition (_document)


def _drop_read_only(c: EndpointRequest, body: dict[str, Any]) -> None:
    """A function as a GET gave it can be saved back: its state and generation go, when they are what is
    stored (a new function's state is undeployed); another state is asked of its own endpoint."""
    given = {key: body.pop(key) for key in READ_ONLY if key in body}
    if not given:
        return
    with c.state.metadata as store:
        try:
            record = store.get_function(c.name)
        except NotFoundError:
            record = None
    now = (
        {"state": record.state.value, "generation": record.generation} if record else {"state": "undeployed"}
    )
    changed = sorted(key for key, value in given.items() if key in now and value != now[key])
    if changed:
        raise ConfigError(
            f"'{changed[0]}' of function '{c.name}' is {now[changed[0]]!r}, not {given[changed[0]]!r}, and a "
            f"save does not change it; leave it out, or POST /api/v1/functions/{c.name}/deploy (or /pause, "
            "/resume, /undeploy) to change the state"
        )


def undeploy(c: EndpointRequest) -> dict[str, Any]:
    _refuse_again(c, "undeployed")
    return stats.function_view(lifecycle.undeploy(c.state, c.name, wait_s=_wait_s(c)))


def get_settings(c: EndpointRequest) -> dict[str, Any] | Response:
    if _couchbase_format(c, default="eventing"):
        return _couchbase_call(lambda: lifecycle.export_couchbase(c.state, c.name)[0]["settings"])
    doc = stored_function(c)
    return {k: v for k, v in doc.items() if k not in ("name", "handler_source", *READ_ONLY)}


def save_settings(c: EndpointRequest) -> dict[str, Any] | Response:
    """Merge the given fields into the stored definition; the handler is kept (an undeployed or paused
    function only, as for the CLI). A body in Couchbase's words (deployment_status, processing_status,
    dcp_stream_boundary, execution_timeout in seconds, ...) changes the settings it maps, then deploys,
    pauses, resumes or undeploys as its status flags ask."""
    body = c.json_object()
    if couchbase_format.is_couchbase_settings(body):
        return _couchbase_call(lambda: _save_couchbase_settings(c, body))
    for key in ("name", "handler_source", "appcode"):
        if key in body:
            raise ConfigError(
                f"settings cannot change '{key}'; use POST /api/v1/functions/{c.name}"
                + ("/appcode" if key != "name" else "")
            )
    with c.state.metadata as store:
        record = store.get_function(c.name)
    defn = FunctionDefinition.from_dict({**record.definition, **body})
    return stats.function_view(lifecycle.save_function(c.state, defn, record.source, saved_by=c.identity))


def _save_couchbase_settings(c: EndpointRequest, body: dict[str, Any]) -> Response:
    fields, state, warnings = couchbase_format.settings_from_couchbase(c.name, body)
    with c.state.metadata as store:
        record = store.get_function(c.name)
    # dcp_stream_boundary is kept (the next deploy starts there), unless the body also deploys: then it is
    # that deploy's boundary, which the deploy keeps
    changed = {
        k: v
        for k, v in fields.items()
        if k != "boundary" or state is None or record.state.value == "undeployed" and state == "undeployed"
    }
    updated = FunctionDefinition.from_dict({**record.definition, **changed})
    if updated != FunctionDefinition.from_dict(
        record.definition
    ):  # only a change needs an undeployed or paused function
        record = lifecycle.save_function(c.state, updated, record.source, saved_by=c.identity)
    if state is not None:
        record = lifecycle.set_state(
            c.state,
            c.name,
            state,
            boundary=fields.get("boundary"),
            wait_s=_wait_s(c),
            deploying=_deploying(c),
        )
    return _with_warnings({**stats.function_view(record), "warnings": warnings}, warnings)


def get_appcode(c: EndpointRequest) -> Response:
    doc = stored_function(c)
    return PlainTextResponse(doc["handler_source"])


def appcode_checksum(c: EndpointRequest) -> Response:
    """The handler source's SHA-256 (Couchbase's /appcode/checksum), text/plain."""

    def run() -> Response:
        doc = stored_function(c)
        return PlainTextResponse(couchbase_format.checksum(doc["handler_source"]))

    return _couchbase_call(run)


def save_appcode(c: EndpointRequest) -> dict[str, Any]:
    source = c.text()
    with c.state.metadata as store:
        record = store.get_function(c.name)
    defn = FunctionDefinition.from_dict(record.definition)
    return stats.function_view(lifecycle.save_function(c.state, defn, source, saved_by=c.identity))


def import_functions(c: EndpointRequest) -> Response:
    """This project's export or Couchbase's (one function or a list); Couchbase's status flags are carried
    out."""
    records, warnings = lifecycle.import_functions(
        c.state, c.json(), deploying=_deploying(c), saved_by=c.identity
    )
    return _with_warnings([stats.function_view(r) for r in records], warnings)


def export_functions(c: EndpointRequest) -> list[dict[str, Any]] | Response:
    """Secrets masked (`*****`), or in clear with ?secrets=true for the admin token only."""
    secrets = c.flag(c.query, "secrets")
    if secrets and c.role != "admin":
        return JSONResponse(
            {
                "error": "secrets=true needs the admin token; the read-only token was given",
                "fix": "send the admin token, or leave out secrets=true to get the secrets as *****",
            },
            status_code=403,
        )
    name = c.query.get("name")
    if name:
        check_function_name(name)
        name = resolve_name(c.state, name, c.query)
    if name and _couchbase_format(c):  # one Python function: this project's export of it, as GET does
        doc = stored_function(EndpointRequest(c.state, {"name": name}, {}, b""))
        if doc.get("language", "python") != "javascript":
            return _with_warnings(
                [lifecycle.export_function(c.state, name, with_secrets=secrets)],
                [PYTHON_SHAPE.format(name=name)],
            )
    if _couchbase_format(c):  # Couchbase's export: JavaScript functions (a Python one is named in a warning)

        def run() -> Response:
            names = [name] if name else [f["name"] for f in list_functions(c)]
            out, warnings = [], []
            for n in names:
                try:
                    exported, more = lifecycle.export_couchbase(c.state, n, with_secrets=secrets)
                except ConfigError as exc:
                    if name:
                        raise
                    warnings.append(str(exc))
                    continue
                out.append(exported)
                warnings.extend(more)
            return _with_warnings(out, warnings)

        return _couchbase_call(run)
    if name:
        return [lifecycle.export_function(c.state, name, with_secrets=secrets)]
    return [lifecycle.export_function(c.state, f["name"], with_secrets=secrets) for f in list_functions(c)]
