"""The retry policy (`retry` of a definition) on the in-process runtime: attempts and waits as the older
settings gave them when there is no policy, max_attempts with its backoff, multiplier and cap, exception
names and HTTP statuses that dead-letter at once, max_event_age turning a retry into an `expired` letter,
a server's Retry-After waited for, and every attempt's error in the dead letter."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.retry import parse_attempts
from eventing.errors import ConfigError
from eventing.execution.limits import retry_after_s
from eventing.ops import dlq as dlq_ops
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store

# Every attempt appends its time to ATTEMPTS (a file: a failed attempt's binding writes are discarded),
# then fails as the document says.
FAILING = """
import json, time

class PaymentDeclined(ValueError):
    pass

def on_update(doc, meta):
    with open(ATTEMPTS, "a") as f:
        f.write(json.dumps({"id": meta.id, "at": time.monotonic()}) + "\\n")
    kind = doc["fail"]
    if kind == "value":
        raise ValueError("bad value")
    if kind == "declined":
        raise PaymentDeclined("card declined")
    if kind == "key":
        raise KeyError("missing")
    if kind == "wrapped":
        try:
            json.loads("{")
        except ValueError as exc:
            raise RuntimeError("wrapped") from exc
    out[meta.id] = {"ok": True}
"""


def definition(name: str, attempts_file, **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "constants": {"ATTEMPTS": str(attempts_file)},
            **extra,
        }
    )


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors


def attempts_of(path, key: str) -> list[float]:
    return [r["at"] for r in map(json.loads, path.read_text().splitlines()) if r["id"] == key]


def letters(data_dir: str, function: str) -> dict:
    return {row.key: row for row in open_store(data_dir).dlq_rows(function)}


def test_without_a_policy_retries_and_retry_backoff_decide_as_before(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    deploy_function(data_dir, definition("fn_old", attempts, retries=2, retry_backoff="40ms"), FAILING)
    source.upsert("k", {"fail": "key"})
    run(data_dir)
    times = attempts_of(attempts, "k")
    assert len(times) == 3
    assert times[1] - times[0] >= 0.04 and times[2] - times[1] >= 0.08  # doubled after each
    letter = letters(data_dir, "fn_old")["k"]
    assert (letter.reason, letter.attempts, letter.error) == ("error", 3, "KeyError: 'missing'")
    assert [a["attempt"] for a in parse_attempts(letter.traceback)] == [1, 2, 3]
    assert all(a["error"] == "KeyError: 'missing'" for a in parse_attempts(letter.traceback))
    assert "Traceback" in letter.traceback  # the last attempt's traceback comes first
    # one traceback, the handler's: not the attempts before it chained, nor the worker's frames that called it
    trace = letter.traceback.split("Attempts:")[0]
    assert trace.count("Traceback") == 1 and "During handling" not in trace
    assert trace.splitlines()[1].strip().startswith('File "<handler of fn_old>"'), trace


def test_a_letter_keeps_the_cause_a_handler_chained_but_not_the_earlier_attempts(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    deploy_function(data_dir, definition("fn_cause", attempts, retries=2, retry_backoff="1ms"), FAILING)
    source.upsert("k", {"fail": "wrapped"})
    run(data_dir)
    letter = letters(data_dir, "fn_cause")["k"]
    trace = letter.traceback.split("Attempts:")[0]
    assert letter.attempts == 3 and letter.error == "RuntimeError: wrapped"
    assert "JSONDecodeError" in trace and "direct cause" in trace  # the handler's own cause, kept
    assert "During handling" not in trace and trace.count("RuntimeError: wrapped") == 1


def test_a_single_attempt_is_the_default_and_its_letter_lists_no_attempts(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    deploy_function(data_dir, definition("fn_once", attempts), FAILING)
    source.upsert("k", {"fail": "key"})
    run(data_dir)
    assert len(attempts_of(attempts, "k")) == 1
    letter = letters(data_dir, "fn_once")["k"]
    assert letter.attempts == 1 and parse_attempts(letter.traceback) == []


def test_max_attempts_waits_by_its_backoff_multiplier_and_cap(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    policy = {"max_attempts": 4, "initial_backoff": "30ms", "multiplier": 3, "max_backoff": "60ms"}
    deploy_function(data_dir, definition("fn_policy", attempts, retry=policy), FAILING)
    source.upsert("k", {"fail": "key"})
    source.upsert("fine", {"fail": ""})
    run(data_dir)
    times = attempts_of(attempts, "k")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) == 4
    assert gaps[0] >= 0.03 and gaps[1] >= 0.06 and gaps[2] >= 0.06  # 30ms, 90ms capped to 60ms, 60ms
    assert max(gaps) < 0.09 + 0.5  # the cap held (90ms and 270ms would have been waited without it)
    letter = letters(data_dir, "fn_policy")["k"]
    assert letter.attempts == 4 and len(parse_attempts(letter.traceback)) == 4
    assert LocalBucket.open(data_dir, "out").get("fine") == {"ok": True}
    assert open_store(data_dir).counters("fn_policy")["retries"] == 3


def test_non_retryable_exception_names_dead_letter_at_once(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    policy = {"max_attempts": 3, "initial_backoff": "1ms", "non_retryable": ["ValueError"]}
    deploy_function(data_dir, definition("fn_names", attempts, retry=policy), FAILING)
    source.upsert("value", {"fail": "value"})
    source.upsert("declined", {"fail": "declined"})  # a subclass of ValueError: named by its base
    source.upsert("key", {"fail": "key"})
    run(data_dir)
    got = letters(data_dir, "fn_names")
    assert len(attempts_of(attempts, "value")) == 1 and got["value"].attempts == 1
    assert got["value"].error == "ValueError: bad value (non_retryable: ValueError)"
    assert len(attempts_of(attempts, "declined")) == 1
    assert got["declined"].error.endswith("(non_retryable: ValueError)")
    assert len(attempts_of(attempts, "key")) == 3 and got["key"].attempts == 3
    assert {row.reason for row in got.values()} == {"error"}


class Statuses(BaseHTTPRequestHandler):
    """/bad answers 400, /busy 503 with Retry-After: 1 the first time then 200, /flaky 500; each request's
    path and time (monotonic) is recorded."""

    seen: list[tuple[str, float]] = []
    busy = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with Statuses.lock:
            Statuses.seen.append((self.path, time.monotonic()))
            status, headers = 200, {}
            if self.path == "/bad":
                status = 400
            elif self.path == "/flaky":
                status = 500
            elif self.path == "/busy":
                Statuses.busy += 1
                if Statuses.busy == 1:
                    status, headers = 503, {"Retry-After": "1"}
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


CALLING = """
def on_update(doc, meta):
    r = curl("POST", api, {"path": doc["path"]})
    if r.status >= 400:
        raise RuntimeError(f"the server answered {r.status}")
    out[meta.id] = {"status": r.status}
"""


@pytest.fixture
def statuses():
    Statuses.seen, Statuses.busy = [], 0
    with serve_http(Statuses) as httpd:
        yield url_of(httpd)


def calling(url: str, retry: dict) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": "fn_http",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": url}],
            "retry": retry,
        }
    )


def test_non_retryable_http_statuses_dead_letter_at_once(data_dir, statuses):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(
        data_dir,
        calling(statuses, {"max_attempts": 3, "initial_backoff": "1ms", "non_retryable": [400, 404]}),
        CALLING,
    )
    source.upsert("bad", {"path": "/bad"})
    source.upsert("flaky", {"path": "/flaky"})
    run(data_dir)
    paths = [p for p, _ in Statuses.seen]
    assert paths.count("/bad") == 1 and paths.count("/flaky") == 3
    got = letters(data_dir, "fn_http")
    assert got["bad"].attempts == 1 and got["bad"].error.endswith("(non_retryable: HTTP 400)")
    assert got["flaky"].attempts == 3 and "non_retryable" not in got["flaky"].error


def test_a_servers_retry_after_is_waited_for_before_the_next_attempt(data_dir, statuses):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, calling(statuses, {"max_attempts": 2, "initial_backoff": "10ms"}), CALLING)
    source.upsert("busy", {"path": "/busy"})
    run(data_dir)
    times = [t for p, t in Statuses.seen if p == "/busy"]
    assert len(times) == 2
    assert times[1] - times[0] >= 1.0  # Retry-After: 1, not the 10ms backoff
    assert LocalBucket.open(data_dir, "out").get("busy") == {"status": 200}
    assert not letters(data_dir, "fn_http")


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s({"Retry-After": "3"}) == 3.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == 10.0
    assert retry_after_s({"Retry-After": "soon"}) == 0.0 and retry_after_s({}) == 0.0


def test_max_event_age_dead_letters_a_mutation_as_expired_instead_of_retrying(data_dir, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    attempts = tmp_path / "attempts.log"
    policy = {"max_attempts": 5, "initial_backoff": "10ms", "max_event_age": "1h"}
    deploy_function(data_dir, definition("fn_age", attempts, retry=policy), FAILING)
    two_hours_ago = int((time.time() - 7200) * 1000)
    source.upsert("old", {"fail": "key"}, arrival_ms=two_hours_ago)
    source.upsert("young", {"fail": "key"})
    run(data_dir)
    got = letters(data_dir, "fn_age")
    assert len(attempts_of(attempts, "old")) == 1  # tried once, then too old to try again
    assert got["old"].reason == "expired" and got["old"].attempts == 1
    assert "older than retry.max_event_age" in got["old"].error
    assert len(attempts_of(attempts, "young")) == 5 and got["young"].reason == "error"
    counters = open_store(data_dir).counters("fn_age")
    assert counters["dlq_expired"] == 1 and counters["dlq_error"] == 1
    # An expired letter is handler work: dlq replay runs it again (and it fails again here).
    report = dlq_ops.replay(data_dir, "fn_age", dlq_ops.DlqSelector(reason="expired"))
    assert report.selected == 1 and len(attempts_of(attempts, "old")) == 2


@pytest.mark.parametrize(
    "retry, message",
    [
        ({"max_attempts": 0}, "retry.max_attempts is 0"),
        ({"max_attempts": 2, "bogus": 1}, "unknown field(s) bogus"),
        ({"initial_backoff": "soon"}, "retry.initial_backoff 'soon'"),
        ({"multiplier": 0.5}, "retry.multiplier is 0.5"),
        ({"non_retryable": [42]}, "retry.non_retryable has 42"),
        ({"non_retryable": "ValueError"}, "must be a list"),
        ({"max_event_age": "0s"}, "retry.max_event_age is 0"),
    ],
)
def test_bad_retry_policies_are_one_line_configuration_errors(retry, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FunctionDefinition.from_dict({"name": "f", "source_bucket": "b", "retry": retry})


def test_retry_and_the_older_settings_are_not_given_together():
    with pytest.raises(ConfigError, match="sets both retry and retries/retry_backoff"):
        FunctionDefinition.from_dict(
            {"name": "f", "source_bucket": "b", "retries": 2, "retry": {"max_attempts": 3}}
        )
    defn = FunctionDefinition.from_dict({"name": "f", "source_bucket": "b", "retry": {"max_attempts": 3}})
    again = FunctionDefinition.from_dict(defn.to_dict())  # an export reads back as it was
    assert again.retry_policy == defn.retry_policy and again.retry_policy.max_attempts == 3
    assert (
        "retries" not in defn.to_dict()
        and "retry" not in FunctionDefinition.from_dict({"name": "f", "source_bucket": "b"}).to_dict()
    )
