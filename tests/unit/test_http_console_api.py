"""What the web console asks of the API, through the ASGI app in-process (httpx's ASGI transport, real
SQLite): an application log that is empty rather than missing, dead letters paged with limit and offset,
the caller's role on every authenticated response, and 401 bodies that tell no token from a wrong one."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
FAILING = """
def on_update(doc, meta):
    raise ValueError("no luck for " + meta.id)
"""


@pytest.fixture
def site(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(12):
        source.upsert(f"k{i:02d}", {"n": i})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_fail", "source_bucket": "src"}), FAILING
    )
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    return Site(build_app(ServerConfig(data_dir, admin_token=ADMIN, read_token=READ)))


class Site:
    """Requests to the app without a server or a socket."""

    def __init__(self, app):
        self.app = app

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                return await client.get(path, headers=headers)

        return asyncio.run(call())


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_app_log_of_a_function_that_has_not_logged_is_empty_and_of_an_unknown_one_a_404(site):
    r = site.get("/getAppLog?name=fn_fail", headers=auth(READ))
    assert (r.status_code, r.text) == (200, "")
    r = site.get("/getAppLog?name=fn_nope", headers=auth(READ))
    assert r.status_code == 404 and "fn_nope" in r.json()["error"]


def test_dead_letters_page_with_limit_and_offset_in_vbucket_seqno_order(site):
    every = site.get("/api/v1/functions/fn_fail/dlq", headers=auth(READ)).json()
    assert len(every) == 12
    pages = [
        site.get(f"/api/v1/functions/fn_fail/dlq?limit=5&offset={o}", headers=auth(READ)).json()
        for o in (0, 5, 10, 15)
    ]
    assert [len(p) for p in pages] == [5, 5, 2, 0]
    assert [r["key"] for p in pages for r in p] == [r["key"] for r in every]
    r = site.get("/api/v1/functions/fn_fail/dlq?limit=5&offset=-1", headers=auth(READ))
    assert r.status_code == 400 and "offset=-1 is negative" in r.json()["error"]
    r = site.get("/api/v1/functions/fn_fail/dlq?limit=0", headers=auth(READ))
    assert r.status_code == 400


def test_authenticated_responses_name_the_callers_role(site):
    assert site.get("/api/v1/status", headers=auth(READ)).headers["x-eventing-role"] == "read"
    assert site.get("/api/v1/status", headers=auth(ADMIN)).headers["x-eventing-role"] == "admin"
    assert "x-eventing-role" not in site.get("/").headers  # the console's page carries no data


def test_401_tells_a_missing_token_from_one_that_is_not_accepted(site):
    missing = site.get("/api/v1/status")
    wrong = site.get("/api/v1/status", headers=auth("not-a-token-of-this-server"))
    assert missing.status_code == wrong.status_code == 401
    assert "none was given" in missing.json()["error"]
    assert "not accepted" in wrong.json()["error"] and "none was given" not in wrong.json()["error"]
    assert "x-eventing-role" not in wrong.headers
