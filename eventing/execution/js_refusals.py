"""What a JavaScript handler may not use, refused at deploy (eventing.execution.javascript,
eventing.execution.static_check): SQL++ (N1QL() and inline statements) and Analytics, found in the code with
its comments and string literals blanked."""

from __future__ import annotations

import re

from eventing.errors import HandlerLoadError

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
            while i < n and source[i] != "\n":
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
