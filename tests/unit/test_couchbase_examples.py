"""Couchbase's own published Eventing examples, run unchanged on this system's JavaScript runtime and compared
with the documents and log lines Couchbase publishes for them.

Couchbase publishes each example (a handler, its settings, its input documents and the documents or log
lines it produced) in its Eventing documentation: the pages `modules/eventing/pages/*.adoc` of the
documentation source (github.com/couchbaselabs/docs-devex, branch release/7.6;
github.com/couchbase/docs-server holds the same pages for 7.2 and older). That documentation is Couchbase's,
under its own licence, so this module carries none of it: it reads the handler, the input documents and the
published output from the pages, at test time, in a checkout named by the environment variable COUCHBASE_DOCS:

    git clone -b release/7.6 https://github.com/couchbaselabs/docs-devex.git /path/docs-devex
    COUCHBASE_DOCS=/path/docs-devex python -m pytest tests/unit/test_couchbase_examples.py

Without it those tests are skipped. Written against release/7.6 at 0f0b5a04.

What each test holds to, and where the published output cannot be compared exactly (the time, random
numbers, cas values, or a page whose output contradicts its own handler), is said in the test. Examples
that need SQL++ are refused at deploy (checked below); the others not run here are listed in
docs/javascript-handlers.md with what they need.

The tests after the examples (always run, with handlers of their own) pin the runtime behaviours the examples
rely on: log() writes each argument as JSON, couchbase.* results have Couchbase's shapes, ICU works
(toLocaleString), Date follows TZ, binary and non-object documents, curl's JSON bodies.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from eventing.api import Eventing
from eventing.errors import HandlerLoadError
from eventing.testing.http_peer import serve_http, url_of

pytest.importorskip("STPyV8")

FUNCTION = "example"
_DOCS = os.environ.get("COUCHBASE_DOCS", "")
PAGES = Path(_DOCS) / "modules" / "eventing" / "pages" if _DOCS else None
needs_docs = pytest.mark.skipif(
    PAGES is None or not PAGES.is_dir(),
    reason="set COUCHBASE_DOCS to a checkout of Couchbase's documentation source (couchbaselabs/docs-devex, "
    "release/7.6) to run Couchbase's published examples",
)
# The zone the published examples were run in (their log stamps are -07:00, their dates US Pacific).
PACIFIC = "America/Los_Angeles"


# -- reading Couchbase's pages ------------------------------------------------------------------------------


def page(name: str) -> str:
    assert PAGES is not None
    return (PAGES / f"{name}.adoc").read_text(encoding="utf-8")


def blocks(name: str, language: str) -> list[str]:
    """The listing blocks of a page marked `[source,<language>]`, in page order."""
    out = []
    for m in re.finditer(
        r"^\[source\s*,\s*([^\],\s]+)[^\]]*\]\s*\n----\n(.*?)\n----\s*$", page(name), re.M | re.S
    ):
        if m.group(1).lower() == language:
            out.append(m.group(2))
    return out


def handlers(name: str) -> list[str]:
    """The handlers a page publishes: its JavaScript blocks that define OnUpdate or OnDelete."""
    found = [b for b in blocks(name, "javascript") if re.search(r"function\s+On(Update|Delete)\s*\(", b)]
    assert found, f"no handler on page {name}"
    return found


def loads(text: str) -> Any:
    """A JSON value as a page prints it (some have a trailing comma before a closing brace)."""
    return json.loads(re.sub(r",(\s*[}\]])", r"\1", text))


def _object_end(text: str, i: int) -> int:
    """The index just past the JSON object opening at text[i]."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError("unterminated JSON object")


def json_at(text: str, start: int) -> Any:
    """The JSON object opening at the first '{' at or after `start`."""
    i = text.index("{", start)
    return loads(text[i : _object_end(text, i)])


def objects(text: str) -> list[Any]:
    """Every top-level JSON object in `text`, in order."""
    out: list[Any] = []
    i = 0
    while (i := text.find("{", i)) >= 0:
        end = _object_end(text, i)
        out.append(loads(text[i:end]))
        i = end
    return out


def keyed(text: str) -> dict[str, Any]:
    """Documents a page lists as `... KEY <key>` followed by the JSON document."""
    return {m.group(1): json_at(text, m.end()) for m in re.finditer(r"KEY:?\s+([^\s{]+)", text)}


def values_rows(text: str) -> list[tuple[str, Any]]:
    """Documents of a SQL++ `INSERT/UPSERT ... VALUES ("key", {...})` statement a page gives as input."""
    return [(m.group(1), json_at(text, m.end())) for m in re.finditer(r'VALUES\s*\(\s*"([^"]+)"\s*,', text)]


def json_sequence(text: str) -> list[Any]:
    """The JSON values of one log message, in order (Couchbase's log() writes each argument as JSON, separated
    by spaces); parsing stops at the first text that is not JSON."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(value)


def published_stamped(text: str) -> list[tuple[str, list[Any]]]:
    """published_log with each message's time stamp."""
    stamps = re.findall(r"^(\S*)\s*\[INFO\] ", text, flags=re.M)
    return list(zip(stamps, published_log(text), strict=True))


def assert_in_published_order(ours: list[list[Any]], text: str, normalize=lambda m: m) -> None:
    """Our messages are the page's, in time order: the console lists a log newest first and lines of the same
    millisecond in any order, so the page's lines are taken by time stamp, each stamp's lines in any order
    (both sides through `normalize`)."""
    groups: dict[str, list[str]] = {}
    for stamp, message in published_stamped(text):
        groups.setdefault(stamp, []).append(json.dumps(normalize(message)))
    at = 0
    for stamp in sorted(groups):
        size = len(groups[stamp])
        assert sorted(json.dumps(normalize(m)) for m in ours[at : at + size]) == sorted(groups[stamp]), stamp
        at += size
    assert at == len(ours)


def published_log(text: str) -> list[list[Any]]:
    """The messages of an application log a page shows (one per `[INFO]`, its JSON possibly spread over the
    following lines), each as its JSON values, in the order the page shows them."""
    parts = re.split(r"^\S*\s*\[INFO\] ", text, flags=re.M)[1:]
    return [json_sequence(re.split(r"^\d{4}-\d\d-\d\dT", p, flags=re.M)[0]) for p in parts]


# -- running a handler ---------------------------------------------------------------------------------------


def app_for(
    data_dir: str, source: str, *, source_bucket: str = "src", bindings=(), docs=(), buckets=(), **settings
) -> Eventing:
    """The handler deployed (as a Couchbase export would be: language javascript) over `source_bucket`, its
    bucket bindings as (alias, bucket, access) and the input documents upserted first."""
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket(source_bucket)
    for b in [*buckets, *(b for _, b, _ in bindings)]:
        app.create_bucket(b)
    for key, doc in docs:
        app.upsert(source_bucket, key, doc)
    definition = {
        "name": FUNCTION,
        "source_bucket": source_bucket,
        "language": "javascript",
        "bindings": [{"alias": a, "bucket": b, "access": access} for a, b, access in bindings],
        **settings,
    }
    app.deploy(definition, source)
    return app


def run(app: Eventing) -> None:
    summary = app.run(until_caught_up=True)
    assert not summary.errors, summary.errors


def logged(app: Eventing) -> list[list[Any]]:
    """The messages the handler logged, oldest first, each as its JSON values."""
    path = Path(app.data_dir) / "logs" / f"{FUNCTION}.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(rf"\S+ \[INFO\] {FUNCTION} \S+ \S+ (.*)$", line)
        assert m, line
        out.append(json_sequence(m.group(1)))
    return out


def document(app: Eventing, bucket: str, key: str) -> Any:
    """The document (a dict, or the bytes of a binary or non-object one), which must be there."""
    doc = app.get(bucket, key)
    assert doc is not None, f"no document {key} in {bucket}"
    return doc


def expiry(app: Eventing, bucket: str, key: str) -> int:
    """A document's expiry, epoch seconds (0: none)."""
    got = app.bucket(bucket).get_doc(key)
    assert got is not None, f"no document {key} in {bucket}"
    return got[2]


def expiration_of(statement: str) -> int:
    """The `{"expiration": N}` of a page's SQL++ UPSERT."""
    m = re.search(r'"expiration"\s*:\s*(\d+)', statement)
    assert m, statement
    return int(m.group(1))


@contextmanager
def clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Iterator[None]:
    """Python's clock `seconds` ahead (documents expiring by then expire); the handler's Date is not moved."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)
    try:
        yield
    finally:
        monkeypatch.setattr(time, "time", real)


def run_at(app: Eventing, monkeypatch: pytest.MonkeyPatch, when: float) -> None:
    """Run with Python's clock held at `when` (epoch seconds): the timers due by then fire, once each. The
    handler's Date is not moved, so a timer a callback sets "30 s from now" is due after `when` as long as
    `when` is under 30 s past the real time (which is how a recurring timer fires once per run)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: when)
    try:
        run(app)
    finally:
        monkeypatch.setattr(time, "time", real)


def shown_documents(name: str) -> list[dict]:
    """The JSON documents a detailed example's page shows in plain listing blocks, in page order (without the
    console's "click to edit" placeholder)."""
    found = re.findall(r"^----\n(\{.*?\})\n----$", page(name), re.M | re.S)
    return [d for b in found for d in objects(b) if "click" not in d]


def dedupe(items: list) -> list:
    """Consecutive repeats dropped (a page shows a control document again before each edit)."""
    return [x for i, x in enumerate(items) if i == 0 or x != items[i - 1]]


def stripped(value: Any) -> Any:
    """Strings without surrounding blanks (a page's key may carry a stray trailing space)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [stripped(v) for v in value]
    if isinstance(value, dict):
        return {k: stripped(v) for k, v in value.items()}
    return value


@pytest.fixture
def pacific(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is US Pacific while the test runs, as where the published examples were run."""
    monkeypatch.setenv("TZ", PACIFIC)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def without(doc: dict, *fields: str) -> dict:
    return {k: v for k, v in doc.items() if k not in fields}


def is_cas(value: Any) -> bool:
    return isinstance(value, str) and value.isdigit()


def local_midnight_ms(date: str, zone: str = PACIFIC) -> int:
    """Date.parse of an 'MM-DD-YYYY' date: local midnight, in ms."""
    month, day, year = (int(p) for p in date.split("-"))
    return int(datetime(year, month, day, tzinfo=ZoneInfo(zone)).timestamp() * 1000)


class _Server:
    """A local HTTP server answering with `respond(handler) -> (status, body bytes, content type)`."""

    def __init__(self, respond):
        outer = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                status, payload, ctype = respond(outer.requests[-1])
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        self._stack = ExitStack()
        self.url = url_of(self._stack.enter_context(serve_http(Handler)), "/")

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def http_server():
    servers: list[_Server] = []

    def start(respond) -> _Server:
        servers.append(_Server(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


SRC_RW = ("src_col", "src", "rw")  # the examples' "src_col": a read-write alias of the source collection
DST_RW = ("dst_col", "dst", "rw")  # and "dst_col": of a destination collection


# -- Couchbase's examples: documents in, documents out ----------------------------------------------------


@needs_docs
def test_basic_bucket_ops(data_dir):
    """basicBucketOps, page 'Function: Basic Bucket Ops' (eventing-handler-basicBucketOps.adoc): its output
    is the application log, four lines, compared exactly (the page lists them newest first)."""
    given, published = blocks("eventing-handler-basicBucketOps", "json")
    app = app_for(
        data_dir, handlers("eventing-handler-basicBucketOps")[0], bindings=[DST_RW], docs=keyed(given).items()
    )
    run(app)
    # the page lists them newest first, two of the same millisecond in either order
    assert sorted(map(json.dumps, logged(app))) == sorted(map(json.dumps, published_log(published)))
    assert app.get("dst", "dst_basic_bkt_ops::1") is None  # deleted by the handler


@needs_docs
def test_fix_email_domains(data_dir):
    """fixEmailDomains, page 'Function: fixEmailDomains' (eventing-handler-fixEmailDomains.adoc): the source
    document is updated in place, compared exactly."""
    given, published = blocks("eventing-handler-fixEmailDomains", "json")
    app = app_for(
        data_dir,
        handlers("eventing-handler-fixEmailDomains")[0],
        bindings=[SRC_RW],
        docs=keyed(given).items(),
    )
    run(app)
    for key, doc in keyed(published).items():
        assert app.get("src", key) == doc
    assert logged(app) == [["OnUpdate: updated field email", "will.smith@bigmovies.com"]]


@needs_docs
def test_redact_shared_data(data_dir):
    """redactSharedData, page 'Function: redactSharedData' (eventing-handler-redactSharedData.adoc): the
    redacted copy written to the destination, compared exactly."""
    given, published = blocks("eventing-handler-redactSharedData", "json")
    app = app_for(
        data_dir,
        handlers("eventing-handler-redactSharedData")[0],
        bindings=[("aws_col", "dst", "rw")],
        docs=keyed(given).items(),
    )
    run(app)
    assert keyed(published) and all(app.get("dst", k) == doc for k, doc in keyed(published).items())


@needs_docs
@pytest.mark.parametrize(
    "name",
    ["eventing-handler-simpleFlatten", "eventing-handler-genericFlatten", "eventing-handler-genericRename"],
)
def test_flatten_and_rename(data_dir, name):
    """simpleFlatten, genericFlatten and genericRename, pages 'Function: simpleFlatten' / 'genericFlatten' /
    'genericRename' (eventing-handler-<name>.adoc): the transformed copy in the destination collection,
    compared exactly; deleting the source document deletes the copy (each page's OnDelete)."""
    given, published = blocks(name, "json")
    inputs = keyed(given)
    app = app_for(data_dir, handlers(name)[0], bindings=[DST_RW], docs=inputs.items())
    run(app)
    outputs = keyed(published)
    assert outputs.keys() == inputs.keys()
    for key, doc in outputs.items():
        assert app.get("dst", key) == doc
        app.remove("src", key)
    run(app)
    assert all(app.get("dst", key) is None for key in outputs)


@needs_docs
@pytest.mark.parametrize(
    "name", ["eventing-handler-removeObjectStubs", "eventing-handler-removeNullsAndEmptys"]
)
def test_remove_stubs_and_nulls(data_dir, name):
    """removeObjectStubs and removeNullsAndEmptys, pages 'Function: removeObjectStubs' /
    'removeNullObjectsAndElements' (eventing-handler-<name>.adoc): the source document pruned in place,
    compared exactly."""
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    run(app)
    outputs = keyed(published)
    assert outputs and all(app.get("src", key) == doc for key, doc in outputs.items())


@needs_docs
def test_convert_xml_to_json(data_dir):
    """convertXMLtoJSON, page 'Function: convertXMLtoJSON' (eventing-handler-convertXMLtoJSON.adoc): the
    source document gets out_json and the crc64 checksum xmlchksum, compared exactly. The page's output shows
    "id": 2 for its input's "id": 1, a field the handler never touches: compared as 1."""
    given, published = blocks("eventing-handler-convertXMLtoJSON", "json")
    app = app_for(
        data_dir,
        handlers("eventing-handler-convertXMLtoJSON")[0],
        bindings=[SRC_RW],
        docs=keyed(given).items(),
    )
    run(app)
    ((key, expected),) = keyed(published).items()
    assert expected["id"] == 2 and keyed(given)[key]["id"] == 1  # the page's slip, as described above
    assert app.get("src", key) == {**expected, "id": 1}
    assert [m[1:] for m in logged(app)] == [
        ["1. INPUT  xml doc.in_xml :", expected["in_xml"]],
        ["2. CHECKSUM doc.in_xml   :", expected["xmlchksum"]],
        ["3. OUTPUT doc.out_json   :", expected["out_json"]],
    ]


@needs_docs
def test_convert_advanced_xml_to_json(data_dir):
    """convertAdvXMLtoJSON, page 'Function: convertAdvXMLtoJSON' (eventing-handler-convertAdvXMLtoJSON.adoc):
    compared exactly. The page's input lacks the </ADVELEM2> its output's in_xml has (the handler never
    changes in_xml), and the published checksum is crc64 of the output's in_xml: that is the input run."""
    given, published = blocks("eventing-handler-convertAdvXMLtoJSON", "json")
    ((key, expected),) = keyed(published).items()
    assert "</ADVELEM2>" in expected["in_xml"] and "</ADVELEM2>" not in keyed(given)[key]["in_xml"]
    app = app_for(
        data_dir,
        handlers("eventing-handler-convertAdvXMLtoJSON")[0],
        bindings=[SRC_RW],
        docs=[(key, {**keyed(given)[key], "in_xml": expected["in_xml"]})],
    )
    run(app)
    assert app.get("src", key) == expected


@needs_docs
def test_data_enrichment_case_1(data_dir):
    """Data Enrichment, page 'Data Enrichment' (eventing-example-data-enrichment.adoc), case 1: each new
    source document gets an enriched copy in the target collection (alias tgt); the page's two documents,
    created one after the other, compared exactly with its results."""
    text = page("eventing-example-data-enrichment").split("*Procedure (Case 2)*")[0]
    shown = [
        d
        for b in re.findall(r"^----\n(\{.*?\})\n----$", text, re.M | re.S)
        for d in objects(b)
        if "click" not in d
    ]
    (first, second), results = (
        [d for d in shown if "ip_num_start" not in d],
        [d for d in shown if "ip_num_start" in d],
    )
    app = app_for(
        data_dir,
        handlers("eventing-example-data-enrichment")[0],
        bindings=[("tgt", "dst", "rw")],
        docs=[("SampleDocument", first)],
    )
    run(app)
    assert app.get("dst", "SampleDocument") == results[0]
    app.upsert("src", "AnotherSampleDocument", second)
    run(app)
    assert app.get("dst", "AnotherSampleDocument") == results[1]
    assert logged(app) == [["document", first], ["document", second]]
    assert app.get("src", "SampleDocument") == first  # the source is not changed


@needs_docs
def test_data_enrichment_case_2(data_dir):
    """Data Enrichment, page 'Data Enrichment' (eventing-example-data-enrichment.adoc), case 2: the source
    documents are enriched in place (alias src, the source collection; the function's own write does not
    run it again), then the page's edit of AnotherSampleDocument is recalculated; compared exactly."""
    text = page("eventing-example-data-enrichment").split("*Procedure (Case 2)*")[1]
    shown = [
        d
        for b in re.findall(r"^----\n(\{.*?\})\n----$", text, re.M | re.S)
        for d in objects(b)
        if "click" not in d
    ]
    (first, second), results = (
        [d for d in shown if "ip_num_start" not in d],
        [d for d in shown if "ip_num_start" in d],
    )
    app = app_for(
        data_dir,
        handlers("eventing-example-data-enrichment")[1],
        bindings=[("src", "src", "rw")],
        docs=[("SampleDocument", first), ("AnotherSampleDocument", second)],
    )
    run(app)
    assert app.get("src", "SampleDocument") == results[0]
    assert app.get("src", "AnotherSampleDocument") == results[1]
    edited, recalculated = results[2], results[3]
    assert edited["ip_start"] != second["ip_start"] and edited["ip_num_start"] == results[1]["ip_num_start"]
    app.upsert("src", "AnotherSampleDocument", edited)
    run(app)
    assert app.get("src", "AnotherSampleDocument") == recalculated
    assert len(logged(app)) == 3  # one call per change made outside the function


@needs_docs
def test_keep_last_n(data_dir):
    """keepLastN (userspace CAS), page 'Function: Keep the Last N User Items'
    (eventing-handler-keepLastN.adoc): the page's ten notifications (its SQL++ UPSERT) leave each user's three
    latest, compared exactly but for "random", the handler's Math.random() check value (a number in [0, 1)
    here)."""
    name = "eventing-handler-keepLastN"
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=values_rows(blocks(name, "sqlpp")[0]))
    run(app)
    outputs = keyed(blocks(name, "json")[0])
    assert list(outputs) == ["user_plus_ntfys:1", "user_plus_ntfys:2"]
    for key, doc in outputs.items():
        got = document(app, "src", key)
        assert without(got, "random") == without(doc, "random")
        assert isinstance(got["random"], float) and 0 <= got["random"] < 1


@needs_docs
def test_advanced_keep_last_n(data_dir):
    """advancedKeepLastN (true CAS), page 'Function: Advanced Keep the Last N User Items'
    (eventing-handler-advanced-keepLastN.adoc): couchbase.get, insert and replace with the cas read; the same
    ten notifications, compared exactly. The page's output for user 1 also shows a "random" field, which this
    handler never writes (it is keepLastN's page's output): compared without it."""
    name = "eventing-handler-advanced-keepLastN"
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=values_rows(blocks(name, "sqlpp")[0]))
    run(app)
    outputs = keyed(blocks(name, "json")[0])
    assert "random" in outputs["user_plus_ntfys:1"] and "random" not in outputs["user_plus_ntfys:2"]
    for key, doc in outputs.items():
        assert app.get("src", key) == without(doc, "random")


@needs_docs
def test_cascade_kv_delete_with_doc(data_dir):
    """cascadeKvDeleteWithDoc, page 'Function: cascadeKvDeleteWithDoc'
    (eventing-handler-cascadeKvDeleteWithDoc.adoc): deleting the proxy document makes OnDelete read and
    delete the real one; the log compared with the page's. The page's line A speaks of an expiry, which the
    published code cannot write: `'A. ...' + options.expired ? 'delete' : ...` is
    `('A. ...' + options.expired) ? 'delete' : ...`, always "delete" (so its second value is compared)."""
    name = "eventing-handler-cascadeKvDeleteWithDoc"
    given = [d for b in blocks(name, "json")[:2] for d in keyed(b).items()]
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=given)
    run(app)
    app.remove("src", "proxy::real::1")
    run(app)
    c, b, a, on_update = published_log(blocks(name, "json")[2])
    assert a[0].startswith("A. ") and "expiry" in a[0] and len(a) == 2
    assert logged(app) == [on_update, ["delete", a[1]], b, c]
    assert app.get("src", "real::1") is None


def _normalized(value: Any) -> Any:
    """A result or document with what differs from run to run, or between Couchbase versions, named: a cas
    string, an expiry_date, a random number; Couchbase 6.6's "data_type" is 7.x's "datatype" (the name here);
    and error codes left out: 6.6's pages show 272 for every error, 7.x the Data Service's status (1 for key
    not found, compared where a 7.x page shows it)."""
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k == "cas" and is_cas(v):
            v = "<cas>"
        elif k == "expiry_date":
            v = "<date>"
        elif k == "random" and isinstance(v, float):
            v = "<random>"
        elif k == "code" and isinstance(v, int):
            continue
        out["datatype" if k == "data_type" else k] = _normalized(v)
    return out


def _meta_part(meta: dict) -> dict:
    """What a logged meta shares with Couchbase's: id, expiration and the vBucket (Couchbase's mapping of
    keys to its 1024 vBuckets); seq and flags depend on the cluster's history and the writer, cas is a
    time."""
    assert is_cas(meta["cas"])
    return {k: meta[k] for k in ("id", "expiration", "vb")}


def _compare_log(ours: list[list[Any]], published: list[list[Any]]) -> None:
    assert len(ours) == len(published), (ours, published)
    for got, shown in zip(ours, published, strict=True):
        if got[:1] == ["input meta"]:
            assert got[0] == shown[0] and _meta_part(got[1]) == _meta_part(shown[1])
        else:
            assert _normalized(got) == _normalized(shown)


def _mutations(name: str) -> list[tuple[str, dict]]:
    """The input documents of an advanced-accessor page ('Mutation #1', '#2', ... in one block)."""
    return list(keyed(blocks(name, "json")[0]).items())


def _one_at_a_time(app: Eventing, mutations: list[tuple[str, dict]]) -> None:
    """The page's mutations made one after the other, each handled before the next (as the pages do)."""
    for key, doc in mutations:
        app.upsert("src", key, doc)
        run(app)


@needs_docs
@pytest.mark.parametrize(
    "name", ["eventing-handler-advancedGetOp", "eventing-handler-advancedGetOpWithCache"]
)
def test_advanced_get(data_dir, name):
    """advancedGetOp and advancedGetOpWithCache, pages 'Function: Advanced GET Operation' / '... with Cache'
    (eventing-handler-<name>.adoc): the logged input, the get of the document and the failed get of a
    missing one, compared with the page's log (see _normalized, _meta_part); the 7.x page's error code 1
    too."""
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=_mutations(name))
    run(app)
    published = published_log(blocks(name, "json")[1])
    _compare_log(logged(app), published)
    error = published[-1][-1]["error"]
    if error["code"] != 272:  # Couchbase 7.x's page
        assert logged(app)[-1][-1]["error"] == error


@needs_docs
@pytest.mark.parametrize("name", ["eventing-handler-advancedInsertOp", "eventing-handler-advancedUpsertOp"])
def test_advanced_insert_and_upsert(data_dir, name):
    """advancedInsertOp and advancedUpsertOp, pages 'Function: Advanced INSERT Operation' / '... UPSERT ...'
    (eventing-handler-<name>.adoc): three mutations one after the other; insert fails for an existing key,
    upsert does not; the second sets a 60 second expiry. Documents compared but for "random"; the log as in
    _compare_log; expiry_date is 60 s ahead, in whole seconds, as the Data Service keeps it."""
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW])
    started = time.time()
    _one_at_a_time(app, _mutations(name))
    documents = keyed(blocks(name, "json")[1])
    for key, doc in documents.items():
        assert without(document(app, "src", key), "random") == without(doc, "random")
    expiring = list(documents)[1]
    assert started + 59 <= expiry(app, "src", expiring) <= time.time() + 61
    ours = logged(app)
    _compare_log(ours, published_log(blocks(name, "json")[2]))
    expiry_date = ours[5][1]["meta"]["expiry_date"]
    assert expiry_date.endswith(".000Z")
    assert datetime.fromisoformat(expiry_date).timestamp() == expiry(app, "src", expiring)


@needs_docs
@pytest.mark.parametrize("name", ["eventing-handler-advancedReplaceOp", "eventing-handler-advancedDeleteOp"])
def test_advanced_replace_and_delete(data_dir, name):
    """advancedReplaceOp and advancedDeleteOp, pages 'Function: Advanced REPLACE Operation' / '... DELETE ...'
    (eventing-handler-<name>.adoc): without a cas, with a wrong cas (cas_mismatch), of a missing key
    (key_not_found, after a map delete in the same call), with the cas just read; the log compared with the
    page's (see _compare_log), and replace's document but for "random"."""
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW])
    _one_at_a_time(app, _mutations(name))
    json_blocks = blocks(name, "json")
    _compare_log(logged(app), published_log(json_blocks[-1]))
    if name.endswith("ReplaceOp"):
        for key, doc in keyed(json_blocks[1]).items():
            assert without(document(app, "src", key), "random") == without(doc, "random")
    else:
        assert app.get("src", "test_adv_delete:10") is None


@needs_docs
@pytest.mark.parametrize(
    "name", ["eventing-handler-advancedIncrementOp", "eventing-handler-advancedDecrementOp"]
)
def test_advanced_counters(data_dir, name):
    """advancedIncrementOp and advancedDecrementOp, pages 'Function: Advanced INCREMENT Operation' /
    '... DECREMENT ...' (eventing-handler-<name>.adoc): ten mutations count to 10 (-10); the counter document
    compared exactly, each logged result with the page's. The decrement page's log lines read "success adv.
    increment: result" (the increment page's), where its handler writes "decrement"."""
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=values_rows(blocks(name, "json")[0]))
    run(app)
    documents = keyed(blocks(name, "json")[1])
    assert documents and all(app.get("src", k) == doc for k, doc in documents.items())
    published, ours = published_log(blocks(name, "json")[2]), logged(app)
    labels = {m[0] for m in published}
    assert len(labels) == 1 and {m[0].replace("decrement", "increment") for m in ours} == labels
    _compare_log(ours, [[ours[0][0], *m[1:]] for m in published])


@needs_docs
def test_advanced_touch(data_dir, monkeypatch):
    """advancedTouchOp, page 'Function: Advanced TOUCH Operation' (eventing-handler-advancedTouchOp.adoc):
    the document gets an expiry 10 s ahead and expires. The page's log shows the input (newest first within
    the same millisecond), the result, and a last "Doc deleted/expired" line from an OnDelete that is not in
    the published handler: that line is not compared; the expiry is, through the bucket."""
    name = "eventing-handler-advancedTouchOp"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    started = time.time()
    run(app)
    shown = published_log(published)
    ours = logged(app)
    assert len(shown) == len(ours) + 1 and shown[-1][1:] == [keyed(given).popitem()[0], {"expired": True}]
    _compare_log(sorted(ours[:2]), sorted(shown[:2]))
    _compare_log(ours[2:], shown[2:3])
    (key,) = keyed(given)
    assert started + 9 <= expiry(app, "src", key) <= time.time() + 11
    with clock_ahead(monkeypatch, 11):
        app.bucket("src").expire_due()
    assert app.get("src", key) is None


@needs_docs
def test_advanced_mutate_in_field(data_dir):
    """advancedMutateInField, page 'Function: Advanced Sub-Document MUTATEIN Operation'
    (eventing-handler-advancedMutateInField.adoc): insert, replace and remove of one field; the three logged
    results compared with the page's (but for the cas), the document left as it was."""
    name = "eventing-handler-advancedMutateInField"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    run(app)
    _compare_log(logged(app), published_log(published))
    ((key, doc),) = keyed(given).items()
    assert app.get("src", key) == doc


@needs_docs
def test_advanced_mutate_in_array(data_dir):
    """advancedMutateInArray, page 'Function: Advanced Sub-Document MUTATEIN Array Operation'
    (eventing-handler-advancedMutateInArray.adoc): each landmark's name appended to one array. The page runs
    it over travel-sample's 4,495 landmarks and shows the first and last three names; here one landmark
    document per shown name stands in, and the array must hold exactly those names."""
    name = "eventing-handler-advancedMutateInArray"
    before, after = blocks(name, "json")
    names = re.findall(r'^\s*"([^"]+)",?\s*$', after, re.M)
    names = [n for n in names if n not in ("id", "landmark_names")]
    assert len(names) == 6
    app = app_for(
        data_dir,
        handlers(name)[0],
        bindings=[DST_RW],
        docs=[(f"landmark_{i}", {"type": "landmark", "name": n}) for i, n in enumerate(names)],
    )
    for key, doc in keyed(before).items():
        app.upsert("dst", key, doc)
    run(app)
    result = document(app, "dst", "combine_landmark_names")
    assert result["id"] == "combine_landmark_names" and sorted(result["landmark_names"]) == sorted(names)


@needs_docs
def test_basic_curl_get(data_dir, http_server):
    """basicCurlGet, page 'Function: Basic cURL GET' (eventing-handler-curl-get.adoc): a GET of the URL
    binding exchangeRateApi (here a local server answering with the response body the page shows, as the
    public service answered then); the logged response body compared exactly."""
    name = "eventing-handler-curl-get"
    given, published = blocks(name, "json")
    ((label, body),) = published_log(published)
    server = http_server(lambda request: (200, json.dumps(body).encode(), "application/json"))
    app = app_for(
        data_dir,
        handlers(name)[0],
        docs=keyed(given).items(),
        url_bindings=[{"alias": "exchangeRateApi", "url": server.url}],
    )
    run(app)
    assert [(r["method"], r["path"]) for r in server.requests] == [("GET", "/latest")]
    assert logged(app) == [[label, body]]


@needs_docs
def test_basic_curl_post(data_dir, http_server):
    """basicCurlPost, page 'Function: Basic cURL POST' (eventing-handler-curl-post.adoc): a POST of
    {"myboolean": true} to the URL binding curlEchoApi (here a local server echoing as the public echo service
    does). What the page's echo shows of the request, compared with the request sent: its JSON body ("data",
    "json"), content type and length; the handler logs the echo."""
    name = "eventing-handler-curl-post"
    given, published = blocks(name, "json")
    ((label, echoed),) = published_log(published)

    def echo(request):
        sent = json.loads(request["body"])
        body = {
            "args": {},
            "data": sent,
            "files": {},
            "form": {},
            "headers": request["headers"],
            "json": sent,
            "url": "echo" + request["path"],
        }
        return 200, json.dumps(body).encode(), "application/json"

    server = http_server(echo)
    app = app_for(
        data_dir,
        handlers(name)[0],
        docs=keyed(given).items(),
        url_bindings=[{"alias": "curlEchoApi", "url": server.url}],
    )
    run(app)
    (request,) = server.requests
    assert (request["method"], request["path"]) == ("POST", "/post")
    assert json.loads(request["body"]) == echoed["json"] == echoed["data"]
    assert request["headers"]["content-type"] == echoed["headers"]["content-type"]
    assert request["headers"]["content-length"] == echoed["headers"]["content-length"]
    ((our_label, our_echo),) = logged(app)
    assert our_label == label and our_echo["json"] == echoed["json"]


@needs_docs
def test_date_to_epoch_conversion(data_dir, pacific):
    """dateToEpochConversion, page 'Function: dateToEpochConversion'
    (eventing-handler-dateToEpochConversion.adoc): every date string of the document, at every depth, becomes
    epoch seconds or milliseconds by the handler's four patterns; compared exactly. Dates without a zone are
    local time (Date.parse): run in US Pacific time, where the page's output was made (13:30:10 is
    20:30:10Z)."""
    name = "eventing-handler-dateToEpochConversion"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    run(app)
    outputs = keyed(published)
    assert outputs and all(app.get("src", key) == doc for key, doc in outputs.items())


@needs_docs
def test_deep_clone_and_modify(data_dir, pacific):
    """deepCloneAndModify, page 'Function: deepCloneAndModify' (eventing-handler-deepCloneAndModify.adoc): the
    same conversion through a generic deep clone, in US Pacific time. Its handler's control table is
    dateToEpochConversion's, and it gives that page's output; this page's output differs in the four fields
    with a zone (datet1c/1d/2c/2d), whose ms/sec rules it shows swapped: those are compared with
    dateToEpochConversion's page, every other field with this page's."""
    name = "eventing-handler-deepCloneAndModify"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    run(app)
    ((key, shown),) = keyed(published).items()
    ((_, same_rules),) = keyed(blocks("eventing-handler-dateToEpochConversion", "json")[1]).items()

    def rules(page_name: str) -> list[str]:
        return [
            line.strip()
            for line in handlers(page_name)[0].splitlines()
            if line.strip().startswith('{ "regx"')
        ]

    assert len(rules(name)) == 4 and rules(name) == rules("eventing-handler-dateToEpochConversion")
    got = document(app, "src", key)
    assert got == same_rules

    def zoned(doc: dict) -> dict:
        return {
            k: zoned(v) if isinstance(v, dict) else v
            for k, v in doc.items()
            if not re.match(r"datet\d[cd]_", k)
        }

    assert zoned(got) == zoned(shown)
    swapped = {k for k in shown if re.match(r"datet\d[cd]_", k)}
    assert swapped == {"datet1c_sec", "datet1d_sec", "datet2c_ms", "datet2d_ms"}


@needs_docs
def test_advanced_doc_controlled_self_expiry(data_dir, pacific):
    """advancedDocControlledSelfExpiry, page 'Function: Advanced Document Controlled Expiry'
    (eventing-handler-advanced-docControlledSelfExpiry.adoc): trials already over are deleted, the others get
    an expiry at start + duration (couchbase.replace with expiry_date), their documents unchanged. As the
    page says to, the last two trials start 90 and 91 days from today (the page's 2021 dates are past); the
    expiry rule is checked against the page's own expirations for its dates."""
    name = "eventing-handler-advanced-docControlledSelfExpiry"
    rows = dict(values_rows(blocks(name, "sqlpp")[0]))
    expiring = list(rows)[2:]
    published = [int(n) for n in re.findall(r"meta\.expiration set for (\d+)", page(name))]
    assert [
        local_midnight_ms(rows[k]["trialStartDate"]) // 1000 + rows[k]["trialDurationDays"] * 86400
        for k in expiring
    ] == published
    today = datetime.now(ZoneInfo(PACIFIC))
    for key, days in zip(expiring, (90, 91), strict=True):
        rows[key]["trialStartDate"] = (today + timedelta(days=days)).strftime("%m-%d-%Y")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=rows.items())
    run(app)
    assert all(app.get("src", key) is None for key in list(rows)[:2])
    shown = keyed(blocks(name, "json")[0])
    assert list(shown) == expiring
    for key in shown:
        doc = rows[key]
        assert app.get("src", key) == doc
        expected = local_midnight_ms(doc["trialStartDate"]) // 1000 + doc["trialDurationDays"] * 86400
        assert expiry(app, "src", key) == expected


@needs_docs
def test_convert_bucket_to_collections(data_dir):
    """ConvertBucketToCollections, page 'Function: Convert Bucket to Collections'
    (eventing-handler-ConvertBucketToCollections.adoc), with its constant bindings DO_COPY and DO_DELETE true:
    beers and breweries move to their own collections and leave the source. The page runs it over the
    beer-sample bucket (1,412 breweries and 5,891 beers, an empty source after); a few documents of each
    type stand in for it, and a document of another type stays."""
    name = "eventing-handler-ConvertBucketToCollections"
    docs = [
        ("brewery_1", {"type": "brewery", "name": "a"}),
        ("brewery_2", {"type": "brewery", "name": "b"}),
        ("beer_1", {"type": "beer", "name": "c"}),
        ("beer_2", {"type": "beer", "name": "d"}),
        ("beer_3", {"type": "beer", "name": "e"}),
        ("other_1", {"type": "other"}),
    ]
    app = app_for(
        data_dir,
        handlers(name)[0],
        source_bucket="beer-sample",
        docs=docs,
        bindings=[
            ("src_col", "beer-sample", "rw"),
            ("beer_col", "beer", "rw"),
            ("brewery_col", "brewery", "rw"),
        ],
        constants={"DO_COPY": True, "DO_DELETE": True},
    )
    run(app)
    assert app.keys("beer-sample") == ["other_1"]
    assert app.keys("brewery") == ["brewery_1", "brewery_2"] and app.keys("beer") == [
        "beer_1",
        "beer_2",
        "beer_3",
    ]
    assert all(app.get(doc["type"], key) == doc for key, doc in docs if doc["type"] != "other")


@needs_docs
@pytest.mark.parametrize(
    "name",
    [
        "eventing-handler-basicN1qlSelectStmt",
        "eventing-handler-basicN1qlPreparedSelectStmt",
        "eventing-handler-docControlledSelfExpiry",
        "eventing-handler-advancedSelfRecursion",
        "eventing-examples-cascade-delete",
    ],
)
def test_examples_using_sql_are_refused_at_deploy(data_dir, name):
    """The examples that query with SQL++ (N1QL() or an inline statement): basicN1qlSelectStmt,
    basicN1qlPreparedSelectStmt, docControlledSelfExpiry, advancedSelfRecursion and Cascade Delete (pages
    eventing-handler-<name>.adoc, eventing-examples-cascade-delete.adoc) are refused when deployed, naming
    the line, since this system has no query service."""
    with pytest.raises(
        HandlerLoadError, match=r"line \d+: (SQL\+\+ \(N1QL\(\)\)|inline SQL\+\+) is not supported"
    ):
        app_for(data_dir, handlers(name)[0], bindings=[SRC_RW])


@needs_docs
def test_lookup_in_example_deploys_and_its_placeholder_paths_fail_its_call(data_dir):
    """advancedLookupInOp, page 'Function: Advanced Sub-Document LOOKUPIN Operation'
    (eventing-handler-advancedLookupInOp.adoc) names XATTRs (an `xattrs` parameter and {"xattrs": false}),
    which bindings serve, so it deploys; its paths are placeholders ("<doc_path_0>"), which no document has,
    so its call is refused and the mutation dead-lettered, and the output it shows is three results of one
    call, advancedMutateInField's page's, so it has nothing to compare with."""
    from eventing.ops import dlq as dlq_ops

    app = app_for(
        data_dir,
        handlers("eventing-handler-advancedLookupInOp")[0],
        bindings=[SRC_RW],
        docs=[("lookupinfield:001", {"id": "lookupinfield:001"})],
    )
    run(app)
    [letter] = dlq_ops.list_rows(data_dir, FUNCTION)
    assert letter.key == "lookupinfield:001" and "<doc_path_0>" in letter.error and logged(app) == []


# -- Couchbase's examples with timers and expiry ----------------------------------------------------------


@needs_docs
def test_simple_timer(data_dir, monkeypatch, pacific):
    """simpleTimer, page 'Function: Simple Timer' (eventing-handler-simpleTimer.adoc): a timer 30 s ahead
    whose callback logs its context; the two log lines compared with the page's, but for what is of the
    moment: the Date (written in the handler's local time, as on the page), the random number, sched."""
    name = "eventing-handler-simpleTimer"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], docs=keyed(given).items())
    before = time.time()
    run(app)
    created = time.time()
    run_at(app, monkeypatch, created + 30.001)
    fired, made = published_log(published)  # newest first
    ours = logged(app)
    assert len(ours) == 2
    # Date.toString()
    a_date = r"\w{3} \w{3} \d\d \d{4} \d\d:\d\d:\d\d GMT-0[78]00 \(Pacific (Daylight|Standard) Time\)"
    assert re.sub(a_date, "<date>", ours[0][0]) == re.sub(a_date, "<date>", made[0]) and "<date>" in re.sub(
        a_date, "<date>", made[0]
    )
    for got, shown in ((ours[0], made), (ours[1], fired)):
        assert without(got[1], "random", "sched") == without(shown[1], "random", "sched")
        assert isinstance(got[1]["random"], float)
    assert ours[1][0] == fired[0] and ours[1][1] == ours[0][1]
    assert before - 0.001 <= datetime.fromisoformat(ours[0][1]["sched"]).timestamp() - 30 <= created


@needs_docs
def test_delete_v_expiry(data_dir, monkeypatch):
    """Delete v Expiry, page 'Delete v Expiry' (eventing-examples-delete-v-expiry.adoc): OnDelete tells an
    expiry (SampleDocument2, made with the page's 600 s expiration; here the clock moves past it) from a
    delete (SampleDocument3, made with the console's default body); the two log lines compared exactly."""
    name = "eventing-examples-delete-v-expiry"
    statement = next(b for b in blocks(name, "sqlpp") if "SampleDocument2" in b)
    ((key, doc),) = values_rows(statement)
    expiration = expiration_of(statement)
    app = app_for(data_dir, handlers(name)[0])
    app.upsert("src", key, doc, expiry=int(time.time()) + expiration)  # the epoch time a 600 s TTL gives
    run(app)
    with clock_ahead(monkeypatch, expiration + 1):
        app.bucket("src").expire_due()
    run(app)
    placeholder = next(
        objects(b)[0] for b in re.findall(r"^----\n(\{.*?\})\n----$", page(name), re.M | re.S) if "click" in b
    )
    app.upsert("src", "SampleDocument3", placeholder)
    run(app)
    app.remove("src", "SampleDocument3")
    run(app)
    assert logged(app) == published_log(page(name))


@needs_docs
def test_cancel_or_overwrite_timer(data_dir, monkeypatch):
    """Cancel or Overwrite Timer, page 'Cancel or Overwrite Timer'
    (eventing-examples-cancel-overwrite-timer.adoc): the page's three tests: a timer fires after 60 s and
    writes its context to the target; a timer is cancelled; a timer is overwritten by one with the same
    reference and fires once. Control documents are the page's, in order; the seven log lines compared with
    the page's, but for tmr_time_to_fire (a Date of the moment) and the trailing space of the page's key; the
    target documents likewise."""
    name = "eventing-examples-cancel-overwrite-timer"
    shown = shown_documents(name)
    controls = dedupe([d for d in shown if d.get("type") == "type_of_interest"])
    targets = [d for d in shown if "docId" in d]
    assert len(controls) == 6 and len(targets) == 2
    key = "type_of_interest::1"
    app = app_for(data_dir, handlers(name)[0], bindings=[("tgt_col", "dst", "rw")], docs=[(key, controls[0])])
    run(app)

    def edit(doc: dict) -> float:
        app.upsert("src", key, doc)
        run(app)
        return time.time()

    created = edit(controls[1])  # test 1: a timer, which fires
    run_at(app, monkeypatch, created + 60.001)
    first = document(app, "dst", key)
    app.remove("dst", key)
    edit(controls[2])  # test 2: a timer, then cancelled
    edit(controls[3])
    run_at(app, monkeypatch, time.time() + 60.001)
    assert app.get("dst", key) is None
    edit(controls[4])  # test 3: a timer, overwritten, fires once
    overwritten = edit(controls[5])
    run_at(app, monkeypatch, overwritten + 60.001)
    second = document(app, "dst", key)
    for got, page_doc in ((first, targets[0]), (second, targets[1])):
        assert without(got, "tmr_time_to_fire") == stripped(without(page_doc, "tmr_time_to_fire"))
    assert first["tmr_time_to_fire"] < second["tmr_time_to_fire"]

    def timeless(messages: list[list[Any]]) -> list[list[Any]]:
        return [[without(v, "tmr_time_to_fire") if isinstance(v, dict) else v for v in m] for m in messages]

    assert timeless(logged(app)) == stripped(timeless(published_log(page(name))))


@needs_docs
def test_recurring_timer(data_dir, monkeypatch):
    """Recurring Timer, page 'Recurring Timer' (eventing-examples-recurring-timer.adoc): a timer that re-arms
    itself from its callback every 30 s and writes a status document, then is cancelled. The page's log of
    test 1 (its fullest listing: five firings) compared exactly, oldest first, then test 2's line; the status
    document has the page's one field, last_update, a UTC time of the last firing."""
    name = "eventing-examples-recurring-timer"
    controls = dedupe([d for d in shown_documents(name) if d.get("type") == "recurring_timer"])
    assert [c["active"] for c in controls] == [False, True, False]
    key = "recurring_timer::1"
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=[(key, controls[0])])
    run(app)
    app.upsert("src", key, controls[1])
    run(app)
    for _ in range(5):
        armed = time.time()
        time.sleep(0.002)
        run_at(app, monkeypatch, armed + 30.001)
    status = document(app, "src", "cur_" + key)
    assert (
        list(status) == ["last_update"]
        and abs(datetime.fromisoformat(status["last_update"]).timestamp() - time.time()) < 5
    )
    app.upsert("src", key, controls[2])
    run(app)
    listings = [b for b in re.findall(r"^----\n(.*?)\n----$", page(name), re.M | re.S) if "[INFO]" in b]
    test_1 = max(listings, key=lambda b: b.count("[INFO]"))
    assert test_1.count("[INFO]") == 13
    assert_in_published_order(logged(app), test_1 + "\n" + listings[-1])


@needs_docs
def test_document_archival(data_dir, monkeypatch):
    """Document Archival, page 'Document Archival' (eventing-examples-docarchive.adoc): each document of a
    collection whose TTL is 600 s gets a timer 120 s before it expires, which copies it to the target. The
    page loads travel-sample's 1,968 airports; a few airport documents stand in, written with the 600 s
    expiry the collection's TTL gives. At expiry - 120 s every copy is in the target, equal to its original;
    after the expiry the originals are gone and the copies stay, as the page says."""
    name = "eventing-examples-docarchive"
    airports = [
        (f"airport_{i}", {"type": "airport", "id": i, "airportname": f"Airport {i}"}) for i in range(5)
    ]
    app = app_for(data_dir, handlers(name)[0], bindings=[("src", "src", "r"), ("tgt", "dst", "rw")])
    for key, doc in airports:
        app.upsert("src", key, doc, expiry=int(time.time()) + 600)
    run(app)
    latest = max(expiry(app, "src", k) for k, _ in airports)
    assert app.keys("dst") == []
    run_at(app, monkeypatch, latest - 120 + 0.001)
    assert all(app.get("dst", key) == doc for key, doc in airports)
    with clock_ahead(monkeypatch, 601):
        app.bucket("src").expire_due()
    run(app)
    assert app.keys("src") == [] and len(app.keys("dst")) == len(airports)


@needs_docs
def test_shipping_notifier(data_dir, monkeypatch):
    """shippingNotifier, page 'Function: Shipping Notifier' (eventing-handler-shippingNotifier.adoc): the
    scheduled-delivery notification's timer (its time long past) fires at once; "shipped" and then
    "delivered" notify at once, and delivery archives the shipment. Every document and log line the page
    shows compared exactly, but for shippedTs/deliveredTs and their notifyTs (the time of the step, here)."""
    name = "eventing-handler-shippingNotifier"
    given = values_rows(blocks(name, "sqlpp")[0])
    app = app_for(
        data_dir,
        handlers(name)[0],
        source_bucket="active",
        docs=given,
        bindings=[("act_col", "active", "rw"), ("arc_col", "archive", "rw"), ("snd_col", "notify", "rw")],
    )
    run(app)
    run(app)  # the timer, due in 2020
    shown = [b for b in blocks(name, "json")]
    ship_key = next(k for k, _ in given if k.startswith("ship:"))
    steps = [keyed(b) for b in shown]
    logs = [
        m
        for chunk in re.split(r"\n\*\* The [Aa]pplication log", page(name))[1:]
        for m in published_log(chunk)[:1]
    ]
    assert len(steps) == 6 and len(logs) == 3

    def step_time(doc: dict, field: str) -> int:
        value = doc[field]
        assert abs(value - time.time()) < 30
        return value

    assert app.get("active", ship_key) == steps[0][ship_key]
    assert app.get("notify", "ntfy:0:" + ship_key) == steps[1]["ntfy:0:" + ship_key]
    times: list[tuple[int, str, int]] = []  # (notification index, field, our time)
    for k, field in ((1, "shipped"), (2, "delivered")):
        doc = document(app, "active", ship_key)
        app.upsert("active", ship_key, {**doc, field: True})
        run(app)
        bucket = "active" if field == "shipped" else "archive"
        got, expected = document(app, bucket, ship_key), steps[2 * k][ship_key]
        at = step_time(got, field + "Ts")
        times.append((k, field + "Ts", at))
        for index, ts_field, ours_at in times:  # each step's time where the page has its own
            assert got[ts_field] == got["notifys"][index]["notifyTs"] == ours_at
            got[ts_field] = got["notifys"][index]["notifyTs"] = expected[ts_field]
        assert got == expected
        notification = app.get("notify", f"ntfy:{k}:{ship_key}")
        assert notification == {**steps[2 * k + 1][f"ntfy:{k}:{ship_key}"], field + "Ts": at}
    assert app.get("active", ship_key) is None
    ours = logged(app)
    assert ours[0] == logs[0]
    assert [m[:1] + [without(m[1], "shippedTs", "deliveredTs")] for m in ours[1:]] == [
        m[:1] + [without(m[1], "shippedTs", "deliveredTs")] for m in logs[1:]
    ]


@needs_docs
def test_faster_to_local_string(data_dir):
    """fasterToLocalString, page 'Function/Benchmark: fasterToLocalString'
    (eventing-handler-fasterToLocalString.adoc): 20,000 d.toLocaleString('en-US') (ICU) against a hand-made
    equivalent. The page's log (7.0.0's four lines) compared but for the moment's date and the timings: both
    ways give the same M/D/YYYY, h:mm:ss AM|PM text. Run in a zone whose local hour is neither 23 nor 0 now
    (the hand-made one writes hour 0 as "0", and a date must not turn over between the two)."""
    name = "eventing-handler-fasterToLocalString"
    zone = next(
        z
        for z in (PACIFIC, "America/New_York", "Asia/Tokyo")
        if datetime.now(ZoneInfo(z)).hour not in (23, 0)
    )
    os.environ["TZ"], previous = zone, os.environ.get("TZ")
    time.tzset()
    try:
        app = app_for(data_dir, handlers(name)[0], docs=[("any", {"type": "any"})])
        run(app)
    finally:
        if previous is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = previous
        time.tzset()
    published = published_log(blocks(name, "json")[-1].split("\n7.0.0\n")[1])
    ours = logged(app)
    assert [m[0] for m in ours] == [m[0] for m in published]
    local = ours[0][1]
    assert re.fullmatch(r"\d{1,2}/\d{1,2}/\d{4}, \d{1,2}:\d\d:\d\d [AP]M", local) and ours[2][1] == local
    assert (
        re.fullmatch(r"\d{1,2}/\d{1,2}/\d{4}, \d{1,2}:\d\d:\d\d [AP]M", published[0][1])
        and published[2][1] == published[0][1]
    )
    assert all(re.fullmatch(r"\d+ ms\.", m[1]) for m in (*ours[1::2], *published[1::2]))


@needs_docs
def test_external_rest_via_curl_get(data_dir, monkeypatch, pacific, http_server):
    """External REST via cURL GET, page 'External REST via cURL GET'
    (eventing-examples-rest-via-curl-get.adoc): a recurring timer, first 30 s ahead then at each local
    midnight, GETs yesterday's exchange rates from the URL binding exchangeRateApi (here a local server
    answering with the rates document the page shows) and stores them; cancelled by test 2. The page's log of
    test 1 and test 2 (not the optional next morning) compared but for the moment's times (the timer's local
    times, the curl time in ms); the stored rates exactly; the status document has the page's fields, valid
    (the page's next-morning one; its first one shows body_valid false, as its own sample server answers with
    JSON text inside a JSON string)."""
    name = "eventing-examples-rest-via-curl-get"
    rates = next(d for d in shown_documents(name) if "amount" in d and len(d["rates"]) > 3)
    server = http_server(lambda request: (200, json.dumps(rates).encode(), "application/json"))
    controls = dedupe([d for d in shown_documents(name) if d.get("type") == "recurring_timer"])
    assert [c["active"] for c in controls] == [False, True, False]
    key = "recurring_timer::1"
    app = app_for(
        data_dir,
        handlers(name)[0],
        bindings=[SRC_RW],
        docs=[(key, controls[0])],
        url_bindings=[{"alias": "exchangeRateApi", "url": server.url + "latest"}],
    )
    run(app)
    app.upsert("src", key, controls[1])
    run(app)
    armed = time.time()
    run_at(app, monkeypatch, armed + 30.001)
    app.upsert("src", key, controls[2])
    run(app)
    today = datetime.now(ZoneInfo(PACIFIC)).date()
    yesterday = (today - timedelta(days=1)).isoformat()
    assert [(r["method"], r["path"]) for r in server.requests] == [("GET", "/latest/" + yesterday)]
    assert app.get("src", "exchange::" + rates["date"]) == rates
    status = document(app, "src", "cur_" + key)
    page_status = next(d for d in shown_documents(name) if d.get("valid") is True)
    assert list(status) == list(page_status) and status["apiReqDateUtc"] == yesterday
    assert (
        status["curl_success"] is True and status["valid"] is True and isinstance(status["curl_time_ms"], int)
    )
    tomorrow = (today + timedelta(days=1)).isoformat() + "T00:00:00.000"
    ours = logged(app)
    assert ours[3][1][:10] == today.isoformat() and [m for m in ours if m[1:] == [tomorrow]]

    def normalize(message: list[Any]) -> list[Any]:
        text = [re.sub(r"took \d+ ms", "took N ms", v) if isinstance(v, str) else v for v in message]
        if len(text) == 2 and isinstance(text[1], str) and re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+", text[1]):
            text[1] = "midnight" if text[1].endswith("T00:00:00.000") else "in 30 s"  # a local time
        return text

    listings = [b for b in re.findall(r"^----\n(.*?)\n----$", page(name), re.M | re.S) if "[INFO]" in b]
    test_1, test_2 = listings[0] + "\n" + listings[1], listings[-1]
    assert_in_published_order(ours, test_1 + "\n" + test_2, normalize)


@needs_docs
def test_document_expiry(data_dir, monkeypatch):
    """Document Expiry, page 'Document Expiry' (eventing-examples-docexpiry.adoc): a document made with the
    page's 600 s expiration gets a timer 2 minutes before it expires, whose callback writes a string document
    (Couchbase keeps any JSON value as a document) to the target, which stays after the original expires.
    The page's four log lines compared but for the expiry Date (checked against the document's expiry)."""
    name = "eventing-examples-docexpiry"
    statement = next(b for b in blocks(name, "sqlpp") if "SampleDocument2" in b)
    ((key, doc),) = values_rows(statement)
    ttl = expiration_of(statement)
    app = app_for(data_dir, handlers(name)[0], bindings=[("src", "src", "r"), ("tgt", "dst", "rw")])
    app.upsert("src", key, doc, expiry=int(time.time()) + ttl)
    run(app)
    expiration = expiry(app, "src", key)
    run_at(app, monkeypatch, expiration - 120 + 0.001)
    copy = document(app, "dst", key)
    assert isinstance(copy, bytes)  # a JSON string document, kept as its JSON text
    written = re.search(
        r'tgt\[context\.docID\] = "([^"]*)" \+ JSON\.stringify\(src\[context\.docID\]\)', handlers(name)[0]
    )
    assert written and json.loads(copy) == written.group(1) + json.dumps(doc, separators=(",", ":"))
    with clock_ahead(monkeypatch, ttl + 1):
        app.bucket("src").expire_due()
    run(app)
    assert app.get("src", key) is None and app.get("dst", key) == copy
    listing = max(
        (b for b in re.findall(r"^----\n(.*?)\n----$", page(name), re.M | re.S)),
        key=lambda b: b.count("[INFO]"),
    )
    ours = logged(app)

    def is_date(value: Any) -> bool:
        return (
            isinstance(value, str)
            and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value) is not None
        )

    (src_expiry,) = [m for m in ours if len(m) == 2 and is_date(m[1])]
    assert datetime.fromisoformat(src_expiry[1]).timestamp() == expiration

    def normalize(message: list[Any]) -> list[Any]:
        return [message[0], "<date>"] if len(message) == 2 and is_date(message[1]) else message

    assert_in_published_order(ours, listing, normalize)


@needs_docs
def test_multi_collection_eventing(data_dir):
    """multiCollectionEventing, page 'Function: Multi Collection Eventing'
    (eventing-handler-multiCollectionEventing.adoc): a function over `source.*.*` with two bindings over
    `source.myscope.*`, reached by couchbase.* with a hard-coded keyspace or the handler's meta. The page's
    three documents are written one at a time, each handled before the next; its log (newest first per
    document) compared in time order: the logged metas by id, expiration, flags, vb, datatype and keyspace
    (Couchbase adds its collection id, `cid`; seq and cas depend on the cluster), the results as in
    _normalized, random1/random2 as random numbers. The function's own writes to source.myscope.mycol2
    (its source) do not run it again, and doc2 is left as it was written (the insert after the delete)."""
    name = "eventing-handler-multiCollectionEventing"
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("source")
    for ks in ("source.myscope.mycol1", "source.myscope.mycol2"):
        app.create_collection(ks)
    wildcard = {"bucket": "source", "scope": "myscope", "collection": "*"}
    app.deploy(
        {
            "name": FUNCTION,
            "source_bucket": "source",
            "source_scope": "*",
            "source_collection": "*",
            "language": "javascript",
            "bindings": [
                {"alias": "alias_ro", **wildcard, "access": "r"},
                {"alias": "alias_rw", **wildcard, "access": "rw"},
            ],
        },
        handlers(name)[0],
    )
    given = re.findall(r"UPSERT INTO (\S+) \(KEY,VALUE\) VALUES \(\s*\"([^\"]+)\"", blocks(name, "sqlpp")[0])
    assert [k for _, k in given] == ["doc0", "doc1", "doc2"]
    for keyspace, key in given:
        statement = blocks(name, "sqlpp")[0]
        doc = json_at(statement, statement.index(f'"{key}"'))
        app.upsert(keyspace.replace("._default._default", ""), key, doc)
        run(app)

    def normalize(message: list[Any]) -> list[Any]:
        if message[0] == ">>>A IN":
            meta = message[2]
            return [
                message[0],
                message[1],
                {k: meta[k] for k in ("id", "expiration", "flags", "vb", "datatype", "keyspace")},
            ]
        out = _normalized(message)
        doc = out[-1].get("doc") if isinstance(out[-1], dict) else None
        for field in ("random1", "random2"):
            if isinstance(doc, dict) and isinstance(doc.get(field), float):
                doc[field] = "<random>"
        return out

    ours = logged(app)
    assert [m[0] for m in ours].count(">>>A IN") == 3  # once per document: never for its own writes
    assert_in_published_order(ours, blocks(name, "log")[0], normalize)
    assert logged(app)[-1][-1]["success"] is True
    assert app.get("source.myscope.mycol2", "doc2") == {"data": "doc2"}
    assert app.get("source.myscope.mycol1", "doc1") == {"data": "doc1"} and app.get("source", "doc0") == {
        "data": "doc0"
    }


def _binary_kv(data_dir: str) -> tuple[Eventing, str, list[str]]:
    name = "eventing-handler-basicBinaryKV"
    given, first, second = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[SRC_RW], docs=keyed(given).items())
    run(app)
    return app, handlers(name)[0], [first, second]


@needs_docs
def test_basic_binary_kv(data_dir):
    """basicBinaryKV, page 'Function: Basic Binary KV' (eventing-handler-basicBinaryKV.adoc), first
    deployment: an ArrayBuffer written and read back through a bucket alias is a binary document; the three
    log lines compared exactly with the page's, the document's bytes in the bucket."""
    app, _, (first, _) = _binary_kv(data_dir)
    assert logged(app) == published_log(first)
    assert app.get("src", "bindoc_kvput") == bytes([1, 0, 2, 3])


@needs_docs
def test_basic_binary_kv_second_deployment(data_dir):
    """basicBinaryKV, page 'Function: Basic Binary KV' (eventing-handler-basicBinaryKV.adoc), second
    deployment: the function receives the binary document it wrote in the first deployment as an ArrayBuffer
    with meta.datatype "binary", and deletes it (the recursion guard suppresses only the current deployment's
    own writes, as Couchbase's does: eventing.storage.origins); its two log lines compared with the page's
    (meta as in _meta_part, with its datatype). The page's line 5 lacks the word "doc" its handler writes."""
    app, source, (_, second) = _binary_kv(data_dir)
    app.undeploy(FUNCTION)
    app.deploy(
        {
            "name": FUNCTION,
            "source_bucket": "src",
            "language": "javascript",
            "bindings": [{"alias": "src_col", "bucket": "src", "access": "rw"}],
        },
        source,
    )
    run(app)
    assert app.get("src", "bindoc_kvput") is None
    (got_4, got_5) = logged(app)[3:]
    (shown_4, shown_5) = published_log(second)
    assert got_4[:3] == shown_4[:3] and got_4[3]["datatype"] == shown_4[3]["datatype"] == "binary"
    assert _meta_part(got_4[3]) == _meta_part(shown_4[3])
    assert [got_5[0].replace("binary doc", "binary")] == shown_5


@needs_docs
def test_advanced_binary_kv(data_dir):
    """advancedBinaryKV, page 'Function: Advanced Binary KV' (eventing-handler-advancedBinaryKV.adoc): a
    binary and a JSON document through the bucket alias and couchbase.upsert / get; get's meta.datatype is
    "binary" or "json" and the documents come back equal. The eight log lines compared with the page's but
    for the cas; the documents checked in the bucket."""
    name = "eventing-handler-advancedBinaryKV"
    given, published = blocks(name, "json")
    app = app_for(data_dir, handlers(name)[0], bindings=[DST_RW], docs=keyed(given).items())
    run(app)
    _compare_log(logged(app), published_log(published))
    for key in ("bindoc_put", "bindoc_upsert", "bindoc_upsert_from_adv_get"):
        assert app.get("dst", key) == bytes([1, 0, 2, 3])
    for key in ("jsondoc_put", "jsondoc_upsert", "jsondoc_upsert_from_adv_get"):
        assert app.get("dst", key) == {"jsondoc": 1}


# -- the runtime behaviours the examples rely on (always run) -----------------------------------------------


def test_log_writes_each_argument_as_json(data_dir):
    """Couchbase's log(): every argument through JSON.stringify (strings quoted), an Error as its toString(),
    undefined as undefined, separated by spaces; meta's fields in Couchbase's order."""
    source = """
function OnUpdate(doc, meta) {
    log('text', 7, true, null, undefined, [1, 'a'], doc, new TypeError('bad'), function f() {});
    log(Object.keys(meta).join(','));
}
"""
    app = app_for(data_dir, source, docs=[("k", {"a": 1})])
    run(app)
    text = (Path(data_dir) / "logs" / f"{FUNCTION}.log").read_text().splitlines()
    assert text[0].endswith(' k "text" 7 true null undefined [1,"a"] {"a":1} "TypeError: bad" undefined')
    assert logged(app)[1] == ["cas,id,expiration,flags,vb,seq,datatype,keyspace"]


def test_advanced_accessor_results_have_couchbases_shapes(data_dir):
    """couchbase.* results as Couchbase builds them (features/src/bucket_ops.cc): keys in its order, a
    write's meta without datatype, errors with the Data Service's code, expiry_date a Date where one was
    set."""
    source = """
function OnUpdate(doc, meta) {
    var later = new Date(Date.now() + 60 * 1000);
    var r = {};
    r.insert = couchbase.insert(dst, {id: 'a'}, {n: 1});
    r.exists = couchbase.insert(dst, {id: 'a'}, {n: 2});
    r.get = couchbase.get(dst, {id: 'a'});
    r.stale = couchbase.replace(dst, {id: 'a', cas: '1'}, {n: 3});
    r.missing = couchbase.get(dst, {id: 'nope'});
    r.expiring = couchbase.upsert(dst, {id: 'b', expiry_date: later}, {n: 4});
    r.is_date = r.expiring.meta.expiry_date instanceof Date;
    r.read_expiring = couchbase.get(dst, {id: 'b'});
    r.touch = couchbase.touch(dst, {id: 'a', expiry_date: later});
    r.count = couchbase.increment(dst, {id: 'c'});
    r.lookup = couchbase.lookupIn(dst, {id: 'a'}, [couchbase.LookupInSpec.get('n'), couchbase.LookupInSpec.get('x')]);
    r.path = couchbase.mutateIn(dst, {id: 'a'}, [couchbase.MutateInSpec.insert('n', 5)]);
    r.deleted = couchbase.delete(dst, {id: 'a'});
    dst['r'] = r;
}
"""  # noqa: E501
    app = app_for(data_dir, source, bindings=[("dst", "dst", "rw")], docs=[("k", {})])
    run(app)
    r = document(app, "dst", "r")
    assert list(r["insert"]) == ["meta", "success"] and list(r["insert"]["meta"]) == ["id", "cas"]
    assert is_cas(r["insert"]["meta"]["cas"]) and r["get"]["meta"]["cas"] == r["insert"]["meta"]["cas"]
    assert r["exists"] == {
        "error": {
            "code": 2,
            "name": "LCB_KEY_EEXISTS",
            "desc": "The document key already exists in the server.",
            "key_already_exists": True,
        },
        "success": False,
    }
    assert list(r["get"]) == ["doc", "meta", "success"] and r["get"]["doc"] == {"n": 1}
    assert list(r["get"]["meta"]) == ["id", "cas", "datatype"] and r["get"]["meta"]["datatype"] == "json"
    assert r["stale"]["error"] == {
        "code": 2,
        "name": "LCB_KEY_EEXISTS",
        "cas_mismatch": True,
        "desc": "The document key exists with a CAS value different than specified",
    }
    assert r["missing"] == {
        "error": {
            "code": 1,
            "name": "LCB_KEY_ENOENT",
            "desc": "The document key does not exist on the server",
            "key_not_found": True,
        },
        "success": False,
    }
    assert list(r["expiring"]["meta"]) == ["id", "cas", "expiry_date"] and r["is_date"] is True
    assert list(r["read_expiring"]["meta"]) == ["id", "cas", "expiry_date", "datatype"]
    assert list(r["touch"]["meta"]) == ["id", "cas"]
    assert list(r["count"]) == ["doc", "meta", "success"] and r["count"]["doc"] == {"count": 1}
    assert r["lookup"]["doc"] == [{"value": 1, "success": True}, {"success": False}]
    assert r["path"]["error"]["field_exists"] is True and r["path"]["error"]["code"] == 201
    assert list(r["deleted"]) == ["meta", "success"] and app.get("dst", "a") is None


def test_icu_locale_formatting_and_time_zones(data_dir, pacific):
    """ICU's data is loaded (STPyV8 starts V8 without it: toLocaleString aborted the process, localeCompare
    threw, local time ignored daylight saving); Date follows TZ, set here after V8 started."""
    source = """
function OnUpdate(doc, meta) {
    var d = new Date(Date.UTC(2009, 5, 29, 20, 30, 10));
    dst['r'] = {local: d.toLocaleString('en-US'), number: (1234.5).toLocaleString('en-US'), order: 'a'.localeCompare('b'),
                string: d.toString(), parsed: Date.parse('2009/06/29 13:30:10'),
                month: new Intl.DateTimeFormat('en-US', {month: 'long'}).format(d)};
}
"""  # noqa: E501
    app = app_for(data_dir, source, bindings=[("dst", "dst", "rw")], docs=[("k", {})])
    run(app)
    assert app.get("dst", "r") == {
        "local": "6/29/2009, 1:30:10 PM",
        "number": "1,234.5",
        "order": -1,
        "string": "Mon Jun 29 2009 13:30:10 GMT-0700 (Pacific Daylight Time)",
        "parsed": 1246307410000,
        "month": "June",
    }


def test_binary_and_non_object_documents(data_dir):
    """An ArrayBuffer is a binary document (stored as its bytes), any other JSON value a JSON document (kept
    as its text); OnUpdate gets a binary document as an ArrayBuffer with meta.datatype "binary", a string
    document as the string with "json"; couchbase.get tells them apart by meta.datatype."""
    source = """
function OnUpdate(doc, meta) {
    if (meta.id === 'go') {
        dst['bin'] = new Uint8Array([1, 0, 255]).buffer;
        dst['str'] = 'text';
        couchbase.upsert(dst, {id: 'arr'}, [1, 2]);
        var read = dst['bin'], got = couchbase.get(dst, {id: 'bin'});
        dst['r'] = {read: Array.from(new Uint8Array(read)), type: got.meta.datatype,
                    got: Array.from(new Uint8Array(got.doc)), str: dst['str'], arr: couchbase.get(dst, {id: 'arr'}).doc};
        return;
    }
    dst['seen::' + meta.id] = {datatype: meta.datatype, buffer: doc instanceof ArrayBuffer,
                               value: doc instanceof ArrayBuffer ? Array.from(new Uint8Array(doc)) : doc};
}
"""  # noqa: E501
    app = app_for(data_dir, source, bindings=[("dst", "dst", "rw")], docs=[("go", {})])
    with app.collection("src") as src:
        src.upsert("b", bytes([7, 8, 200]))
        src.upsert("s", b'"a string"')
    run(app)
    assert app.get("dst", "r") == {
        "read": [1, 0, 255],
        "type": "binary",
        "got": [1, 0, 255],
        "str": "text",
        "arr": [1, 2],
    }
    assert app.get("dst", "bin") == bytes([1, 0, 255]) and app.get("dst", "str") == b'"text"'
    assert app.get("dst", "seen::b") == {"datatype": "binary", "buffer": True, "value": [7, 8, 200]}
    assert app.get("dst", "seen::s") == {"datatype": "json", "buffer": False, "value": "a string"}


def test_curl_sends_an_object_body_as_compact_json(data_dir, http_server):
    """curl's body, when not a string, goes as JSON.stringify writes it, with Content-Type
    application/json."""
    server = http_server(lambda request: (200, b'{"ok": true}', "application/json"))
    source = "function OnUpdate(doc, meta) { curl('POST', api, {path: 'p', body: {a: 1, b: [true]}}); }"
    app = app_for(data_dir, source, docs=[("k", {})], url_bindings=[{"alias": "api", "url": server.url}])
    run(app)
    (request,) = server.requests
    assert (
        request["body"] == b'{"a":1,"b":[true]}' and request["headers"]["content-type"] == "application/json"
    )


@needs_docs
def test_risk_assessment(data_dir):
    """Risk Assessment, page 'Risk Assessment' (eventing-examples-high-risk.adoc), with the page's data files
    (its attachments examples/high_risk/*.json, keyed as its cbimport commands key them). The page listens to
    the register collection it loads (its settings name 'source', which it never loads), binds register
    read-only and review read-write. Transactions over the card's threshold or in a foreign currency are
    copied to review: the page's 40, its sample review document exactly, each log line it shows. Then, as
    the page does: review emptied, the function paused, its handler edited to verbose = 3, resumed, and one
    transaction's amount changed: the nine log lines the page shows, exactly. The page also loads
    merchants.json, which the handler never reads (it handles transactions only): left out here."""
    name = "eventing-examples-high-risk"
    data = Path(_DOCS) / "modules" / "eventing" / "assets" / "attachments" / "examples" / "high_risk"
    docs = [
        (f"{d['type']}:{d[field]}", d)
        for file, field in (("txns", "txnid"), ("cards", "cardnumber"), ("exchange_rates", "erid"))
        for d in json.loads((data / f"{file}.json").read_text())
    ]
    source = handlers(name)[0]
    bindings = [("register", "register", "r"), ("review", "review", "rw")]
    app = app_for(data_dir, source, source_bucket="register", bindings=bindings, docs=docs)
    run(app)
    assert len(app.keys("review")) == 40
    text = page(name)
    sample = next(d for d in shown_documents(name) if d.get("reason_code"))
    assert document(app, "review", "transaction:" + sample["txnid"]) == sample
    ours = logged(app)
    tails = [b for b in re.findall(r"^----\n(.*?)\n----$", text, re.M | re.S) if "[INFO]" in b]
    shown = published_log("\n".join(tails[:2]))
    assert len(shown) == 14 and all(m in ours for m in shown)
    for key in app.keys("review"):  # the page's DELETE FROM review
        app.remove("review", key)
    app.pause(FUNCTION)
    edited = source.replace("var verbose = 0;", "var verbose = 3;")
    assert edited != source
    app.save(
        {
            "name": FUNCTION,
            "language": "javascript",
            "source_bucket": "register",
            "bindings": [{"alias": a, "bucket": b, "access": x} for a, b, x in bindings],
        },
        edited,
    )
    app.resume(FUNCTION)
    key = "transaction:" + sample["txnid"]
    changed = document(app, "register", key)
    assert changed["amount"] == 5383.35
    app.upsert("register", key, {**changed, "amount": 5383.36})
    run(app)
    assert len(published_log(tails[2])) == 9 and logged(app)[len(ours) :] == published_log(tails[2])
