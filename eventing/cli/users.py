"""`eventing user add|list|remove`: users of the REST and Data APIs and their roles.

A password never travels as an argument (it would show in the process list): it is read from a prompt
(twice, on a terminal), from stdin with --password-stdin, or from $EVENTING_USER_PASSWORD. Only a salted
scrypt hash is stored; `user list` shows names and roles.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from eventing.cli.output import emit_json, table
from eventing.errors import ConfigError

PASSWORD_ENV = "EVENTING_USER_PASSWORD"


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise ConfigError("the two passwords differ; run the command again")
    else:
        raise ConfigError(
            f"no password for user '{args.name}': stdin is not a terminal; pipe it with "
            f"--password-stdin or set ${PASSWORD_ENV}"
        )
    from eventing.security.users import check_password

    return check_password(password)


def cmd_user_add(args: argparse.Namespace) -> int:
    from eventing.cli.common import writable_state
    from eventing.security.users import check_user_name, hash_password, parse_roles

    check_user_name(args.name)
    roles = [str(g) for g in parse_roles(args.role or [])]
    with writable_state(args).metadata as store:
        names = {u.name for u in store.list_users()}
        if args.name in names and not args.replace:
            raise ConfigError(f"user '{args.name}' exists; add --replace to give it a new password and roles")
        password = _password(args)
        record = store.put_user(args.name, hash_password(password), roles)
    if args.json:
        emit_json({"name": record.name, "roles": list(record.roles)})
    else:
        verb = "replaced" if args.name in names else "added"
        print(
            f"user '{record.name}' {verb} with roles {', '.join(record.roles)}; it signs in by HTTP Basic "
            "(curl -u NAME) within 2 s on a running server"
        )
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    from eventing.cli.common import state_of
    from eventing.errors import NotFoundError

    try:
        store = state_of(args).metadata
    except NotFoundError:
        users: list[Any] = []
    else:
        try:
            users = store.list_users()
        finally:
            store.close()
    if args.json:
        emit_json([{"name": u.name, "roles": list(u.roles), "created_at": u.created_at} for u in users])
    elif users:
        print(table(["user", "roles"], [[u.name, " ".join(u.roles)] for u in users]))
    else:
        print("no users; add one with `eventing user add NAME --role ROLE`")
    return 0


def cmd_user_remove(args: argparse.Namespace) -> int:
    from eventing.cli.common import existing_state

    with existing_state(args).metadata as store:
        store.delete_user(args.name)
    if args.json:
        emit_json({"name": args.name, "removed": True})
    else:
        print(f"user '{args.name}' removed; a running server refuses it within 2 s")
    return 0


def register(sub: Any, add: Any) -> None:
    user = sub.add_parser(
        "user",
        help="users of the REST and Data APIs: add, list, remove",
        description="Users of the REST and Data APIs (HTTP Basic) and their roles.",
    )
    usub = user.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    p = add(
        "add",
        cmd_user_add,
        f"add a user; the password comes from a prompt, --password-stdin or ${PASSWORD_ENV}",
        usub,
    )
    p.add_argument("name")
    p.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help="admin, ro_admin, eventing_manage_functions[BUCKET:SCOPE], "
        "data_reader[BUCKET.SCOPE.COLLECTION], data_writer[BUCKET.SCOPE.COLLECTION] (`*` for any part); "
        "repeat for several",
    )
    p.add_argument(
        "--password-stdin", action="store_true", help="read the password from the first line of stdin"
    )
    p.add_argument("--replace", action="store_true", help="replace an existing user's password and roles")
    add("list", cmd_user_list, "users and their roles (never a password or hash)", usub)
    p = add("remove", cmd_user_remove, "remove a user", usub)
    p.add_argument("name")


__all__ = ["register"]
