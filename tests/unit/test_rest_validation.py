"""What the REST API answers to bad parameters, through the ASGI app in-process (httpx's ASGI transport,
real SQLite): a 400 naming the parameter and the values it accepts, checked before the function's state
(so a bad request is a 400 in every state), JSON booleans in bodies, 405 with an Allow header for a method
a path does not answer, and messages that name endpoints and parameters rather than CLI flags."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import NotFoundError, fix
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.http.routes import ENDPOINTS
from eventing.http.routes.request import error_body
from eventing.ops import dlq
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.windows.semantics.arrival import DROP_REASONS
from eventing.workers.executor import InProcessExecutor

FAILING = """
def on_update(doc, meta):
    raise ValueError("no luck for " + meta.id)
"""
FN = "/api/v1/functions/fn_fail"


class Site:
    """Requests to the app without a server or a socket (loopback, no tokens: the caller is trusted)."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.app = build_app(ServerConfig(data_dir))

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())

    def dead_letters(self) -> int:
        return len(dlq.list_rows(self.data_dir, "fn_fail", include_replayed=True))


@pytest.fixture
def site(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(6):
        source.upsert(f"k{i}", {"n": i})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_fail", "source_bucket": "src"}), FAILING
    )
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    out = Site(data_dir)
    assert out.dead_letters() == 6
    return out


def bad_request(response: httpx.Response, *fragments: str) -> str:
    """A 400 whose one-line error contains every fragment; returns the error."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "\n" not in error
    for fragment in fragments:
        assert fragment in error, error
    return error


@pytest.mark.parametrize("size", ["-1", "0", "ten", "1.5"])
def test_app_log_size_must_be_a_positive_whole_number(site, size):
    bad_request(
        site.request("GET", f"/getAppLog?name=fn_fail&size={size}"), f"size={size}", "whole number >= 1"
    )
    assert site.request("GET", "/getAppLog?name=fn_fail&size=4096").status_code == 200


def test_an_unknown_dead_letter_reason_is_refused_with_the_known_ones(site):
    error = bad_request(
        site.request("GET", f"{FN}/dlq?reason=nope"), "reason 'nope'", "error", "timeout", "late"
    )
    for reason in DROP_REASONS[1:]:  # the arrival-time policies' reasons are known reasons too
        assert reason in error
    assert len(site.request("GET", f"{FN}/dlq?reason=error").json()) == 6
    bad_request(site.request("POST", f"{FN}/dlq/purge", json={"reason": "nope"}), "reason 'nope'")
    assert site.dead_letters() == 6


@pytest.mark.parametrize("body", [{"all": "yes"}, {"all": 1}, {"all": "true"}, {"replayed": "1"}])
def test_booleans_in_a_body_must_be_json_booleans(site, body):
    [(key, value)] = body.items()
    bad_request(site.request("POST", f"{FN}/dlq/purge", json=body), f'"{key}"', "true or false")
    assert site.dead_letters() == 6  # nothing purged
    bad_request(site.request("POST", f"{FN}/dlq/replay", json=body))


def test_query_flags_take_true_false_1_0_and_nothing_else(site):
    assert len(site.request("GET", f"{FN}/dlq?all=true").json()) == 6
    assert len(site.request("GET", f"{FN}/dlq?all=0").json()) == 6
    bad_request(site.request("GET", f"{FN}/dlq?all=maybe"), "all=maybe", "all=true or all=false")
    bad_request(site.request("GET", f"{FN}/checkpoints?backlog=2"), "backlog=2")


def test_a_purge_with_all_true_still_purges(site):
    r = site.request("POST", f"{FN}/dlq/purge", json={"all": True})
    assert (r.status_code, r.json()["purged"]) == (200, 6)


@pytest.mark.parametrize("wait", ["-5", "soon", "nan", "inf"])
@pytest.mark.parametrize("action", ["pause", "undeploy"])
def test_wait_must_be_a_number_of_seconds_at_least_zero(site, action, wait):
    bad_request(site.request("POST", f"{FN}/{action}?wait={wait}"), f"wait={wait}", "seconds >= 0")
    assert site.request("GET", "/api/v1/status/fn_fail").json()["app"]["composite_status"] == "deployed"


def test_a_bad_parameter_is_a_400_in_every_state_and_a_good_one_in_the_wrong_state_a_409(site):
    # Deployed: a valid settings body is refused for the state, an invalid one for itself.
    assert site.request("POST", f"{FN}/settings", json={"worker_count": 2}).status_code == 409
    bad_request(site.request("POST", f"{FN}/settings", json={"worker_count": -5}), "worker_count")
    bad_request(site.request("POST", f"{FN}/settings", json={"source_bucket": 5}), "bucket name 5")
    # Undeployed: resuming is illegal, but a bad wait is still a 400, not a 409.
    lifecycle.undeploy(site.data_dir, "fn_fail")
    assert site.request("POST", f"{FN}/pause").status_code == 409
    bad_request(site.request("POST", f"{FN}/pause?wait=-5"), "wait=-5")
    bad_request(site.request("POST", f"{FN}/deploy", json={"boundary": "yesterday"}), "boundary")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/functions/fn_fail/dlq?limit=0",
        "/api/v1/functions/fn_fail/dlq?limit=-3",
        "/api/v1/functions/fn_fail/windows?limit=-1",
        "/api/v1/functions/fn_fail/checkpoints?vb=-1",
        "/api/v1/functions/fn_fail/dlq/show?vb=x&seqno=1",
    ],
)
def test_whole_number_parameters_name_themselves(site, path):
    name, value = re.search(r"\?(\w+)=([^&]+)", path).groups()  # type: ignore[union-attr]
    bad_request(site.request("GET", path), f"{name}={value}")


def test_methods_a_path_does_not_answer_are_405_with_an_allow_header_on_every_route(site):
    by_path: dict[str, set[str]] = {}
    for ep in ENDPOINTS:
        by_path.setdefault(ep.path.replace("{name}", "fn_fail").replace("{node}", "n1"), set()).add(ep.method)
    for path, methods in by_path.items():
        allowed = methods | ({"HEAD"} if "GET" in methods else set())
        for method in sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - methods):
            r = site.request(method, path)
            assert r.status_code == 405, (method, path, r.status_code, r.text)
            assert set(r.headers["allow"].split(", ")) == allowed, (method, path)
            assert f"{method} is not allowed on {path}" in r.json()["error"]
    # Couchbase's API creates and updates with POST; PUT is as unknown as PATCH, and says so.
    r = site.request("PUT", FN, json={})
    assert r.status_code == 405 and "POST creates and updates" in r.json()["fix"]
    assert set(site.request("PUT", "/").headers["allow"].split(", ")) == {"GET", "HEAD"}
    # A path under /api/v1/functions/ that no endpoint has stays a 404 whatever the method.
    assert site.request("PUT", f"{FN}/nope").status_code == 404


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", f"{FN}/dlq/show?vb=3&seqno=17", None),
        ("GET", f"{FN}/dlq/show", None),
        ("GET", f"{FN}/dlq/show?seqno=1", None),
        ("GET", f"{FN}/dlq?limit=0", None),
        ("POST", f"{FN}/dlq/purge", {}),
        ("POST", f"{FN}/dlq/replay", {}),
        ("POST", f"{FN}/dlq/purge", {"all": True, "vb": 3}),
        ("GET", f"{FN}/verify", None),
    ],
)
def test_errors_name_endpoints_and_parameters_not_cli_flags(site, method, path, body):
    r = site.request(method, path, json=body) if body is not None else site.request(method, path)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert "--" not in error and "`eventing" not in error, error


@pytest.mark.parametrize(
    "way, cli, rest",
    [
        (fix("dlq_list", function="fn_x"), "`eventing dlq list fn_x`", "GET /api/v1/functions/fn_x/dlq"),
        (
            fix("dlq_purge_replayed", function="fn_x"),
            "`eventing dlq purge fn_x --replayed`",
            'POST /api/v1/functions/fn_x/dlq/purge with {"replayed": true}',
        ),
        (
            fix("undeploy", function="fn_x"),
            "`eventing undeploy fn_x`",
            "POST /api/v1/functions/fn_x/undeploy",
        ),
        (fix("status"), "`eventing status`", "GET /api/v1/status"),
        (
            fix("option", flag="--ledger", value="BUCKET"),
            "--ledger BUCKET",
            "the query parameter ledger=BUCKET",
        ),
        (
            fix("collection_create", keyspace="b.s.c"),
            "`eventing collection create b.s.c`",
            "POST /api/v1/buckets/b/scopes/s/collections/c",
        ),
    ],
)
def test_each_face_words_an_errors_way_out_itself(way, cli, rest):
    error = NotFoundError("it is missing; see {fix}", fix=way)
    assert str(error) == f"it is missing; see {cli}"  # the CLI prints str(error)
    status, body = error_body(error)
    assert status == 404 and body["error"] == f"it is missing; see {rest}" and body["fix"] == f"see {rest}"
    assert body["fix_request"] == {
        "action": way.action,
        "args": {k: str(v) for k, v in way.args.items()},
        "request": rest,
    }
