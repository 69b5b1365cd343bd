"""Who wrote a log entry: its `origin`, the deployment of the function whose binding wrote it, or None (a
client, the Data API, a load). The worker's recursion guard compares it with its own deployment's, so a
deployment never handles its own writes to its source (across worker restarts, rebalance and `dlq replay`,
which write under the same origin), while a later deployment of the same function (deployed again, a new
generation) does handle what an earlier one wrote, as Couchbase suppresses only the current deployment's
writes.

An origin is `<function>@<generation>`; function names hold no `@` (eventing.core.definition), so the
function part is everything before it. Entries written before origins named the deployment carry the bare
function name: they count as the writes of every deployment of that function (the rule they were written
under), so a deployment running across an upgrade still never handles its own earlier writes.
"""

from __future__ import annotations

SEPARATOR = "@"


def deployment_origin(function: str, generation: int) -> str:
    """The origin of the writes of one deployment (a generation) of `function`."""
    return f"{function}{SEPARATOR}{generation}"


def origin_function(origin: str | None) -> str | None:
    """The function an origin names (None for None)."""
    return None if origin is None else origin.split(SEPARATOR, 1)[0]


def is_own(origin: str | None, function: str, generation: int | None) -> bool:
    """Whether deployment `generation` of `function` wrote the entry (a bare function name: any deployment
    did). With `generation` None: whether any deployment of `function` did."""
    if origin is None:
        return False
    if generation is None or origin == function:
        return origin_function(origin) == function
    return origin == deployment_origin(function, generation)


def of_function_sql(column: str = "origin") -> str:
    """SQL true for the entries any deployment of a function wrote; takes the parameters of
    of_function_params, in order."""
    return f"({column} = ? OR substr({column}, 1, ?) = ?)"


def of_function_params(function: str) -> tuple[str, int, str]:
    prefix = function + SEPARATOR
    return function, len(prefix), prefix
