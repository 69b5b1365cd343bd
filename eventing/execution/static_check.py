"""A handler checked without running any of its code: what saving a function checks.

Saving a function (REST, import, the CLI) never imports its handler: the top-level code of a handler runs
only at deploy or resume, in the process it will run in (sandboxed for a function a non-admin deployed,
see eventing.control.lifecycle). Saving checks what can be known without running it:

- Python: the source parses and compiles (`compile` runs nothing), on_update or on_delete is bound at the
  module's top level (a windowed function may have neither), and each of on_update, on_delete and
  on_deploy written as a `def` or a `lambda` takes its positional arguments (doc, meta), (meta, options),
  (action). A name bound another way (an import, an assignment of a call) is checked when it is imported.
- JavaScript: what this system does not run is refused (SQL++, Analytics, XATTRs), V8 compiles the
  script without running it (a syntax error names its line), and OnUpdate or OnDelete appears in its code.

Errors read as the import's own (eventing.execution.loader), so a user sees the same line at save as at
deploy.
"""

from __future__ import annotations

import ast
import re

from eventing.errors import HandlerLoadError
from eventing.execution.loader import check_batch_entry

ENTRY_POINTS = {
    "on_update": ("doc", "meta"),
    "on_delete": ("meta", "options"),
    "on_deploy": ("action",),
    "on_batch": ("batch",),
}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_NOT_CALLABLE = (
    ast.Constant,
    ast.List,
    ast.Dict,
    ast.Tuple,
    ast.Set,
    ast.JoinedStr,
    ast.ListComp,
    ast.DictComp,
    ast.SetComp,
    ast.GeneratorExp,
)


def check_handler_source(
    function: str,
    source: str,
    *,
    windowed: bool = False,
    language: str = "python",
    batch_refused_by: str | None = None,
) -> None:
    """Raise HandlerLoadError for a handler that cannot load, found without running any of it."""
    if language == "javascript":
        _check_javascript(function, source, windowed)
        return
    filename = f"<handler of {function}>"
    try:
        tree = ast.parse(source, filename)
        compile(
            tree, filename, "exec", dont_inherit=True
        )  # what parsing alone lets through ('return' outside def)
    except SyntaxError as exc:
        raise HandlerLoadError(
            f"handler of function '{function}' has a syntax error at line {exc.lineno}: {exc.msg}; "
            "fix the file and deploy again"
        ) from None
    except (
        ValueError,
        RecursionError,
        MemoryError,
    ) as exc:  # NUL bytes; expressions nested too deep to compile
        what = (
            "is nested too deeply to compile"
            if not isinstance(exc, ValueError)
            else f"cannot be compiled ({exc})"
        )
        raise HandlerLoadError(
            f"handler of function '{function}' {what}; fix the file and deploy again"
        ) from None
    bound = _top_level_bindings(tree)
    if "*" not in bound and not {"on_update", "on_delete", "on_batch"} & set(bound) and not windowed:
        raise HandlerLoadError(
            f"handler of function '{function}' defines neither on_update(doc, meta) nor on_delete(meta, "
            "options); define at least one (or on_batch(batch))"
        )
    check_batch_entry(
        function,
        "on_batch" in bound,
        "on_update" in bound or "on_delete" in bound,
        "a window" if windowed else batch_refused_by,
    )
    for name, params in ENTRY_POINTS.items():
        values = bound.get(name, ())
        if len(values) == 1:  # bound more than once (or conditionally): the import at deploy knows which
            _check_entry_point(function, name, params, values[0])


def runs_no_code(source: str, language: str = "python") -> bool:
    """Whether importing the handler runs nothing of its author's: a Python module of docstrings, other
    constants and `pass`, or a script of comments alone (a window-only function's usual file). A sandbox
    would confine none of such a handler's code, so its worker runs unconfined (eventing.workers.hosting)."""
    if language == "javascript":
        from eventing.execution.javascript import _code_only

        # Comments and whitespace alone; a carriage return or a Unicode line or paragraph separator ends a
        # JavaScript line comment, so a file holding one is never taken for one without code.
        return not _code_only(source).strip() and not any(c in source for c in "\r\u2028\u2029")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False  # the import reports it, sandboxed
    return all(
        isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        for node in tree.body
    )


def _top_level_bindings(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Names bound at module level (in `if`, `try`, `with` and loops too, not inside a def or class): name
    -> what each binding binds (a def, a lambda, a constant, or the statement for anything else). A star
    import binds "*": it may bind anything."""
    bound: dict[str, list[ast.AST]] = {}
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.setdefault(node.name, []).append(node)
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
            stack.append(node.value)
            stack.extend(t for t in targets if not isinstance(t, ast.Name))
            continue
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound.setdefault(alias.asname or alias.name.split(".")[0], []).append(node)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.setdefault(node.id, []).append(node)
        stack.extend(ast.iter_child_nodes(node))
    return bound


def _check_entry_point(function: str, name: str, params: tuple[str, ...], value: ast.AST) -> None:
    shown = ", ".join(params)
    if isinstance(value, _NOT_CALLABLE):
        kind = type(value.value).__name__ if isinstance(value, ast.Constant) else type(value).__name__.lower()
        raise HandlerLoadError(
            f"handler of function '{function}': {name} is a {kind}, not a function; define it as def "
            f"{name}({shown}):"
        )
    if not isinstance(value, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return  # bound by an import, a class or a call: checked when the handler is imported at deploy
    if isinstance(value, ast.FunctionDef | ast.AsyncFunctionDef) and value.decorator_list:
        return  # a decorator may change what the name holds
    args = value.args
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    kw_required = any(default is None for default in args.kw_defaults)
    # on_update(doc, meta, xattrs) is allowed as well: its third argument is the document's user extended
    # attributes (eventing.execution.loader.takes_xattrs).
    counts = (len(params), 3) if name == "on_update" else (len(params),)
    if kw_required or all(required > n or (positional < n and args.vararg is None) for n in counts):
        raise HandlerLoadError(
            f"handler of function '{function}': {name}({ast.unparse(args)}) cannot be called as "
            f"{name}({shown}); define it as def {name}({shown}):"
        )


_ENTRY = re.compile(r"\b(?:OnUpdate|OnDelete)\b")


def _check_javascript(function: str, source: str, windowed: bool) -> None:
    from eventing.execution.javascript import _code_only, check_supported, compile_only

    check_supported(function, source)
    compile_only(function, source)
    if not windowed and not _ENTRY.search(_code_only(source)):
        raise HandlerLoadError(
            f"handler of function '{function}' defines neither OnUpdate(doc, meta) nor OnDelete(meta, "
            "options); define at least one"
        )
