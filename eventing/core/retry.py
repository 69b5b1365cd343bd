"""A function's retry policy (the definition's `retry`): how many times a failed handler call runs, how
long it waits between attempts, which failures are not worth another attempt, and how old a mutation may
get before it is dead-lettered as `expired` instead of tried again (see docs/handler-api.md, "Retry policy").

Without `retry` the policy is the one the older settings give: `retries` + 1 attempts, waiting
`retry_backoff` doubled after each, no cap, no age limit, every error retried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from eventing.core import durations

# A server's Retry-After is waited for before the next attempt up to this long: a worker that waits holds up
# its vBuckets, so a longer answer is cut to this (the attempt after it may get another 429).
RETRY_AFTER_MAX_S = 300.0
MAX_ATTEMPTS = 100
FIELDS = ("max_attempts", "initial_backoff", "max_backoff", "multiplier", "max_event_age", "non_retryable")


class RetryConfigError(ValueError):
    """A `retry` setting that is not valid; the message names the field and how to write it."""


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    initial_backoff_s: float = 0.1
    max_backoff_s: float | None = None  # None: no cap
    multiplier: float = 2.0
    max_event_age_s: float | None = None  # None: a mutation never expires
    non_retryable: frozenset[str] = field(default_factory=frozenset)  # exception / JavaScript error names
    non_retryable_statuses: frozenset[int] = field(default_factory=frozenset)  # HTTP statuses curl got

    def backoff(self, attempt: int, retry_after_s: float = 0.0) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based) before the next one: initial_backoff *
        multiplier ** (attempt - 1), at most max_backoff, and at least a server's Retry-After."""
        delay = self.initial_backoff_s * (self.multiplier ** (attempt - 1))
        if self.max_backoff_s is not None:
            delay = min(delay, self.max_backoff_s)
        return max(delay, min(retry_after_s, RETRY_AFTER_MAX_S))

    def expired(self, event_ms: int, delay_s: float, now: float | None = None) -> bool:
        """Whether a mutation that happened at `event_ms` (epoch ms; 0: unknown, never expires) would be
        older than max_event_age by the time its next attempt starts, `delay_s` from now."""
        if self.max_event_age_s is None or event_ms <= 0:
            return False
        now = time.time() if now is None else now
        return now + delay_s - event_ms / 1000 > self.max_event_age_s

    def refuses(self, names: tuple[str, ...], statuses: frozenset[int] | set[int]) -> str | None:
        """The non_retryable entry a failure matches (an error name, or a status curl got in the attempt),
        else None."""
        for name in names:
            if name in self.non_retryable:
                return name
        if self.non_retryable_statuses:
            for status in sorted(statuses):
                if status in self.non_retryable_statuses:
                    return f"HTTP {status}"
        return None


def legacy_policy(retries: int, retry_backoff: timedelta) -> RetryPolicy:
    """The policy of the older settings: `retries` extra attempts, `retry_backoff` doubling after each."""
    return RetryPolicy(max_attempts=retries + 1, initial_backoff_s=retry_backoff.total_seconds())


def parse_retry(raw: Any) -> dict[str, Any]:
    """A definition's `retry` object checked and normalised (durations as text, names sorted), as stored;
    raises RetryConfigError naming the field."""
    if not isinstance(raw, dict):
        raise RetryConfigError(
            'retry must be an object, for example {"max_attempts": 5, "initial_backoff": "200ms", '
            '"max_backoff": "10s", "multiplier": 2, "max_event_age": "1h", "non_retryable": ["ValueError", '
            "400]}"
        )
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise RetryConfigError(
            f"retry has unknown field(s) {', '.join(unknown)}; known fields: {', '.join(FIELDS)}"
        )
    out: dict[str, Any] = {}
    attempts = raw.get("max_attempts", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS:
        raise RetryConfigError(
            f"retry.max_attempts is {attempts!r}; give an integer from 1 to {MAX_ATTEMPTS} (attempts in all, "
            "the first included)"
        )
    out["max_attempts"] = attempts
    for key, default in (("initial_backoff", "100ms"), ("max_backoff", None), ("max_event_age", None)):
        value = raw.get(key, default)
        if value is None:
            continue
        try:
            out[key] = durations.format_duration(durations.parse_duration(value, field=f"retry.{key}"))
        except durations.DurationError as exc:
            raise RetryConfigError(str(exc).removeprefix("has ")) from None
    if "max_event_age" in out and durations.parse_duration(out["max_event_age"]) <= timedelta(0):
        raise RetryConfigError(
            "retry.max_event_age is 0; give a positive duration such as '1h', or leave it out"
        )
    multiplier = raw.get("multiplier", 2)
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or not 1 <= multiplier <= 100:
        raise RetryConfigError(
            f"retry.multiplier is {multiplier!r}; give a number from 1 to 100 (2 doubles the wait)"
        )
    out["multiplier"] = multiplier
    names, statuses = [], []
    listed = raw.get("non_retryable", [])
    if not isinstance(listed, list):
        raise RetryConfigError(
            'retry.non_retryable must be a list of error names and HTTP statuses, for example ["ValueError", '
            "400]"
        )
    for item in listed:
        if isinstance(item, str) and item.strip() and item.replace(".", "").replace("_", "").isalnum():
            names.append(item)
        elif isinstance(item, int) and not isinstance(item, bool) and 100 <= item <= 599:
            statuses.append(item)
        else:
            raise RetryConfigError(
                f'retry.non_retryable has {item!r}; give exception or error names ("ValueError", '
                '"TypeError") and HTTP statuses (400 to 599)'
            )
    out["non_retryable"] = sorted(set(names)) + sorted(set(statuses))
    return out


def policy_of(retry: dict[str, Any]) -> RetryPolicy:
    """The policy a normalised `retry` object (parse_retry's) declares."""

    def seconds(key: str) -> Any:
        return durations.parse_duration(retry[key]).total_seconds() if key in retry else None

    listed = retry.get("non_retryable", [])
    return RetryPolicy(
        max_attempts=retry.get("max_attempts", 1),
        initial_backoff_s=seconds("initial_backoff") if "initial_backoff" in retry else 0.1,
        max_backoff_s=seconds("max_backoff"),
        multiplier=float(retry.get("multiplier", 2)),
        max_event_age_s=seconds("max_event_age"),
        non_retryable=frozenset(n for n in listed if isinstance(n, str)),
        non_retryable_statuses=frozenset(n for n in listed if isinstance(n, int)),
    )


def error_names(exc: BaseException) -> tuple[str, ...]:
    """The names a non_retryable entry may give for `exc`: a JavaScript error's name (`TypeError`, a class
    of the handler's own), or the Python exception's class and base classes, short and qualified."""
    js_name = getattr(exc, "js_name", None)
    if js_name:
        return (js_name,)
    names: list[str] = []
    for cls in type(exc).__mro__:
        if cls is BaseException or cls is object:
            continue
        names.append(cls.__name__)
        names.append(f"{cls.__module__}.{cls.__qualname__}")
    return tuple(names)


def attempts_text(errors: list[tuple[int, float, str]]) -> str:
    """Every attempt's error, one line each, as a dead letter's traceback ends with them."""
    lines = ["Attempts:"]
    for attempt, at, error in errors:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
        lines.append(f"  {attempt} at {stamp}: {error}")
    return "\n".join(lines)


def parse_attempts(traceback: str) -> list[dict[str, Any]]:
    """The attempts a dead letter's traceback lists (attempts_text), as {attempt, at, error}; [] if none."""
    head, sep, tail = traceback.rpartition("Attempts:\n")
    if not sep:
        return []
    out = []
    for line in tail.splitlines():
        number, _, rest = line.strip().partition(" at ")
        stamp, _, error = rest.partition(": ")
        if number.isdigit() and stamp:
            out.append({"attempt": int(number), "at": stamp, "error": error})
    return out
