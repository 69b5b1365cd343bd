"""The Data API against OpenAPI descriptions, with requests generated from them (schemathesis): this
server's own (`GET /v1/openapi.json`) always, and Couchbase's official one (dataapiv1/spec.yaml of
couchbase/stellar-gateway) when a copy is given: $DATAAPI_SPEC (the file) or $DATAAPI_SPEC_REPO (a git
checkout of that repository). Every answer must
be a documented status code with the documented content type, headers and schema, and never a 5xx,
from a real `eventing serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import ignored_auth

from eventing.testing import wait_for

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent / "eventing"
EXAMPLES = 8  # per operation: the whole module stays well under a minute
TOKEN = "schema-test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _official_spec_text() -> str | None:
    given = os.environ.get("DATAAPI_SPEC")
    if given:
        return Path(given).read_text()
    repo = os.environ.get("DATAAPI_SPEC_REPO")
    if not repo or not Path(repo).exists():
        return None
    shown = subprocess.run(
        ["git", "-C", repo, "show", "HEAD:dataapiv1/spec.yaml"], capture_output=True, text=True
    )
    return shown.stdout if shown.returncode == 0 else None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("dataapi-schema")
    env = {**os.environ, "EVENTING_ADMIN_TOKEN": TOKEN, "EVENTING_READ_TOKEN": ""}
    subprocess.run(
        [str(BIN), "bucket", "create", "shop", "--data-dir", str(data)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(BIN), "serve", "--data-dir", str(data), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            return httpx.get(f"{base}/v1/callerIdentity", headers=AUTH, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=30, what="eventing serve answering /v1/callerIdentity")
    yield base
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


@pytest.fixture(scope="module")
def own_schema(server):
    return schemathesis.openapi.from_url(f"{server}/v1/openapi.json", headers=AUTH)


@pytest.fixture(scope="module")
def official_schema(server):
    text = _official_spec_text()
    if text is None:
        pytest.skip("no copy of Couchbase's dataapiv1/spec.yaml given ($DATAAPI_SPEC or $DATAAPI_SPEC_REPO)")
    import yaml

    return schemathesis.openapi.from_dict(_media_ranges(yaml.safe_load(text)))


def _media_ranges(node):
    """The official description names "any type" `*` (and an empty body ``), which are not media types:
    read them as `*/*` (an empty key dropped), so requests can be generated from it."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "content" and isinstance(value, dict):
                value = {("*/*" if k == "*" else k): v for k, v in value.items() if k != ""}
            out[key] = _media_ranges(value)
        return out
    if isinstance(node, list):
        return [_media_ranges(v) for v in node]
    return node


SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def conforms(schema, base: str) -> None:
    """Every operation of `schema`, EXAMPLES generated requests each, checked by schemathesis's checks."""
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @SETTINGS
        @given(case=operation.as_strategy())
        def check(case) -> None:
            # not ignored_auth: its wrong credentials trip the server's failed-login limit (429 for this
            # client), and credentials are tested in tests/unit/test_dataapi.py and test_users_and_roles.py
            case.call_and_validate(base_url=base, headers=AUTH, excluded_checks=[ignored_auth])

        try:
            check()
        except Exception as exc:  # keep going: report every operation that fails
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)


def test_the_data_api_conforms_to_its_own_openapi_document(own_schema, server):
    conforms(own_schema, server)


def test_the_data_api_conforms_to_couchbase_s_description(official_schema, server):
    conforms(official_schema, server)
