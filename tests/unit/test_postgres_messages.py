"""How the PostgreSQL store words what went wrong (one line naming the server and the way out, the statement
PostgreSQL quotes left out) and keeps passwords out of sight: where they are in a URL as written, and a
command's own arguments rewritten so `ps` does not show them."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from metadata.postgres.location import describe_error, parse_postgres_url, password_spans


def test_password_spans_are_where_the_url_holds_its_passwords():
    for text, passwords in (
        ("postgresql://app:pw@db:5432/events", ["pw"]),
        ("--store=postgres://app:p%40w@h1:1,h2:2/db?password=zz&sslmode=require", ["p%40w", "zz"]),
        ("postgresql://app@db/events?sslmode=require", []),
        ("postgresql://db/events?application_name=x&password=abc", ["abc"]),
        ("/var/lib/eventing", []),
    ):
        assert [text[a:b] for a, b in password_spans(text)] == passwords, text


def test_a_commands_arguments_show_no_password_once_it_has_hidden_them():
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from eventing.cli.process_title import hide_passwords as h; n = h(); "
            "print(n, open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode())",
            "--store",
            "postgresql://app:s3cret-pw@127.0.0.1:5432/db?password=other-s3cret",
            "run",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.startswith("2 ") and "s3cret" not in shown
    assert "--store postgresql://app:*********@127.0.0.1:5432/db?password=************ run" in shown


TARGET = parse_postgres_url("postgresql://limited:pw@127.0.0.1:5432/events")


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (
            psycopg.errors.InsufficientPrivilege(
                "permission denied for schema public\nLINE 1: CREATE TABLE IF NOT EXISTS "
                "eventing_commits(token UUID...\n                                     ^"
            ),
            [
                "PostgreSQL at 127.0.0.1:5432: permission denied for schema public; grant",
                "GRANT CREATE, USAGE ON SCHEMA public TO limited)",
            ],
        ),
        (
            psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
            [
                "canceled a statement at its statement_timeout (canceling statement due to statement "
                "timeout); raise it"
            ],
        ),
        (
            psycopg.errors.TooManyConnections("sorry, too many clients already"),
            ["has no connection slot left", "max_connections", "EVENTING_PG_POOL_SIZE"],
        ),
        (
            psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
            ["is read-only", "target_session_attrs=read-write"],
        ),
    ],
)
def test_errors_are_one_line_naming_the_server_and_the_way_out(error, words):
    line = describe_error(TARGET, error)
    assert "\n" not in line and "LINE 1" not in line and "unreachable" not in line and ":pw@" not in line
    for text in words:
        assert text in line, line


@pytest.mark.parametrize("url", ["postgresql://x:secretpw@[::1", "postgres://u:secretpw@[fe80::1/db"])
def test_a_malformed_url_is_one_line_without_its_password(url, tmp_path):
    from metadata.errors import ConfigError

    with pytest.raises(ConfigError, match="malformed") as raised:
        parse_postgres_url(url)
    assert "secretpw" not in str(raised.value)
    done = subprocess.run(
        [sys.executable, "-m", "eventing", "--store", url, "bucket", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert "secretpw" not in done.stderr + done.stdout
