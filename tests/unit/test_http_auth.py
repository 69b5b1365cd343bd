"""Token parsing, roles and the bind rule of the HTTP server (no server needed)."""

from __future__ import annotations

import base64

import pytest

from eventing.errors import ConfigError
from eventing.http.auth import ServerConfig, needs_admin, presented_token, role_of

ADMIN = "a" * 20
READ = "r" * 20


def test_bearer_and_basic_carry_the_token():
    assert presented_token(f"Bearer {ADMIN}") == ADMIN
    basic = base64.b64encode(f"Administrator:{READ}".encode()).decode()
    assert presented_token(f"Basic {basic}") == READ
    assert presented_token("Basic not-base64!") is None
    assert presented_token(None) is None
    assert presented_token("Digest x") is None


def test_roles_admin_reads_and_writes_read_only_reads_unknown_is_nobody():
    config = ServerConfig("d", admin_token=ADMIN, read_token=READ)
    assert role_of(config, ADMIN) == "admin"
    assert role_of(config, READ) == "read"
    assert role_of(config, "x" * 20) is None
    assert role_of(config, None) is None
    assert role_of(ServerConfig("d"), None) == "admin"  # loopback without tokens: trusted like the local CLI
    assert needs_admin("POST") and needs_admin("delete") and not needs_admin("GET")


def test_tokens_come_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("EVENTING_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("EVENTING_READ_TOKEN", READ)
    config = ServerConfig.from_env("d", host="127.0.0.1", port=1)
    assert (config.admin_token, config.read_token) == (ADMIN, READ)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"host": "0.0.0.0"}, "refusing to bind 0.0.0.0 without credentials"),
        ({"host": "10.0.0.5", "read_token": READ}, "refusing to bind 10.0.0.5 without credentials"),
        ({"admin_token": "short"}, "the admin token is 5 characters; use at least 16"),
        ({"admin_token": ADMIN, "read_token": ADMIN}, "the admin and read-only tokens are the same"),
    ],
)
def test_unsafe_configurations_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig("d", **kwargs).check()


def test_loopback_without_tokens_and_any_address_with_an_admin_token_are_allowed():
    ServerConfig("d").check()
    ServerConfig("d", host="::1").check()
    ServerConfig("d", host="0.0.0.0", admin_token=ADMIN, read_token=READ).check()
