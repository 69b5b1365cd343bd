"""Function lifecycle commands: create, deploy, pause, resume, undeploy, delete, list, status, export,
import."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from eventing.cli.common import announce, existing_state, state_of, writable_state
from eventing.cli.output import emit_json, table
from eventing.errors import ConfigError, LifecycleError
from eventing.storage.state import State
from sharding import NUM_VBUCKETS


def _name_or_file(args: argparse.Namespace, state: State) -> str:
    """`deploy` takes a definition file (saved first) or the name of a stored function."""
    from eventing.control import lifecycle

    target = args.function
    if target.endswith(".json") or os.path.sep in target:
        return lifecycle.save_from_file(state, target).name
    return target


def _refuse_if_paused(target: str, state: State) -> None:
    """Deploying a paused function is an illegal move; say which moves do what the user likely wants."""
    from eventing.core.definition import load_definition_file
    from metadata import FunctionState

    is_file = target.endswith(".json") or os.path.sep in target
    name = load_definition_file(target)[0].name if is_file else target
    if not state.exists():
        return
    with state.metadata as store:
        known = {r.name: r for r in store.list_functions()}
    if name in known and known[name].state is FunctionState.PAUSED:
        update = f"`eventing create {target}` updates its definition and handler, then " if is_file else ""
        raise LifecycleError(
            f"function '{name}' is paused, so it cannot be deployed again; {update}`eventing resume {name}` "
            "continues from its checkpoints (to start over from the feed boundary: `eventing undeploy "
            f"{name}`, then deploy)"
        )


def cmd_create(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    state = writable_state(args)
    return announce(args, lifecycle.save_from_file(state, args.file), "saved")


def cmd_deploy(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    state = writable_state(args)
    _refuse_if_paused(args.function, state)
    name = _name_or_file(args, state)
    record = lifecycle.deploy(state, name, args.boundary)
    _say_if_unconfined_by_default(record)
    return announce(args, record, "deployed")


def _say_if_unconfined_by_default(record) -> None:
    """One line on stderr when a function without an `isolation` setting runs unconfined because this
    machine cannot sandbox although EVENTING_DEFAULT_ISOLATION asks for the sandbox (the default, none, is
    said by `status`)."""
    from eventing.core.definition import FunctionDefinition
    from eventing.workers.sandbox.default import isolation_of, unconfined_by_default

    defn = FunctionDefinition.from_dict(record.definition)
    if defn.isolation or isolation_of(defn, record.deployed_by) != "none":
        return
    why = unconfined_by_default()
    if not why or not why.startswith("this machine"):
        return
    print(
        f"note: function '{record.name}' runs unconfined (isolation none), {why}; its handler can read and "
        "write every bucket and the metadata store",
        file=sys.stderr,
    )


def cmd_pause(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    return announce(args, lifecycle.pause(existing_state(args), args.function, wait_s=args.wait), "paused")


def cmd_resume(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    record = lifecycle.resume(existing_state(args), args.function)
    _say_if_unconfined_by_default(record)
    return announce(args, record, "resumed")


def cmd_undeploy(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    return announce(
        args, lifecycle.undeploy(existing_state(args), args.function, wait_s=args.wait), "undeployed"
    )


def cmd_delete(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    lifecycle.delete(existing_state(args), args.function)
    if args.json:
        emit_json({"name": args.function, "deleted": True})
    else:
        print(f"function '{args.function}' deleted")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from eventing.ops.stats import function_view as record_view

    state = state_of(args)
    records = state.metadata.list_functions() if state.exists() else []
    views = [record_view(r) for r in records]
    if args.json:
        emit_json(views)
    elif not views:
        print("no functions; deploy one with `eventing deploy functions/fn_email.json`")
    else:
        print(
            table(
                ["function", "state", "source", "workers", "boundary", "bindings"],
                [
                    [
                        v["name"],
                        v["state"],
                        v["source_bucket"],
                        v["workers"],
                        v["boundary"],
                        " ".join(v["bindings"]),
                    ]
                    for v in views
                ],
            )
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from eventing.ops.mirrors import mirror_health
    from eventing.ops.stats import function_status
    from eventing.workers.sandbox.confine import sandbox_report

    state = existing_state(args)
    status = function_status(state, args.function)
    services, leader, standbys, views = (
        status["services"],
        status["leader"],
        status["standbys"],
        status["functions"],
    )
    sandbox = (
        sandbox_report()
    )  # this machine's: what a sandboxed handler is confined by, or why it cannot run
    mirrored = mirror_health(state) if not args.function else []
    # Deployed or paused functions whose handlers run unconfined: asked for "isolation": "none" (an admin),
    # or on a machine that cannot sandbox.
    unconfined = [v["name"] for v in views if v["isolation"] == "none" and v["state"] != "undeployed"]
    # Sandboxed functions an admin let write outside their sandbox (sandbox_writable), with where.
    granted = [
        f"{v['name']} ({', '.join(v['sandbox_writable'])})"
        for v in views
        if v.get("sandbox_writable") and v["state"] != "undeployed"
    ]
    if args.json:
        emit_json(
            {
                "store": state.shown,
                "services": services,
                "leader": leader,
                "standbys": standbys,
                "functions": views,
                "sandbox": sandbox,
                "unconfined": unconfined,
                "mirrors": mirrored,
            }
        )
    else:
        print(f"store: {state.shown}")  # never its password
        print(f"eventing service: {'running (' + ', '.join(services) + ')' if services else 'not running'}")
        print(f"sandbox: {sandbox}")
        if unconfined:
            fix = (
                "this machine cannot sandbox (above)"
                if sandbox.startswith("unavailable")
                else 'deploy with "isolation": "sandbox" to confine them (EVENTING_DEFAULT_ISOLATION='
                "sandbox: every function without the setting)"
            )
            print(
                f"  unconfined (isolation none): {', '.join(unconfined)}; their handlers can read and write "
                f"every bucket and the metadata store: {fix}"
            )
        if granted:
            print(f"  sandboxed, writing outside their sandbox too (sandbox_writable): {'; '.join(granted)}")
        if leader is not None:
            print(
                f"  leader: {leader['id']} (lease term {leader['term']}, expires in "
                f"{leader['expires_in_s']:.1f}s)"
            )
        if services:
            print(f"  standby: {', '.join(standbys) if standbys else 'none'}")
        for v in views:
            line = (
                f"  {v['name']}: {v['state']} ({v['vbuckets_leased']}/{NUM_VBUCKETS} vBuckets owned by live "
                "workers"
            )
            if v["vbuckets_leased_by_stopped_service"]:
                line += (
                    f"; {v['vbuckets_leased_by_stopped_service']} still leased by a service that stopped "
                    "without releasing them, which the next `eventing run` takes over"
                )
            print(line + ")" + (f"; {v['hint']}" if v.get("hint") else ""))
        for m in mirrored:
            lag = ""
            if m["lag_bytes"] is not None:  # the seconds are known only while changes wait to be applied
                seconds = f", {m['lag_s']} s" if m["lag_s"] is not None else ""
                lag = f" (lag {m['lag_bytes']} bytes{seconds})"
            print(f"  mirror {m['keyspace']} of {m['table']}: {m['state']}{lag}")
            for warning in m["warnings"]:
                print(f"warning: mirror {m['keyspace']}: {warning}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle

    data: Any
    if args.format == "couchbase":  # Couchbase's export: a list of functions, as its console writes
        exported, warnings = lifecycle.export_couchbase(
            existing_state(args), args.function, with_secrets=args.with_secrets
        )
        data = [exported]
        for line in warnings:
            print(f"warning: {line}", file=sys.stderr)
    else:
        data = lifecycle.export_function(existing_state(args), args.function, with_secrets=args.with_secrets)
    text = json.dumps(data, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        if args.json:
            emit_json({"function": args.function, "output": args.output})
        else:
            print(f"exported function '{args.function}' to {args.output}")
    else:
        print(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from eventing.control import lifecycle
    from eventing.ops.stats import function_view as record_view

    state = writable_state(args)
    try:
        data = json.loads(Path(args.file).read_text())
    except FileNotFoundError:
        raise ConfigError(f"file {args.file} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{args.file} is not valid JSON ({exc})") from None
    records, warnings = lifecycle.import_functions(state, data)  # this project's export or Couchbase's
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.json:
        emit_json([record_view(r) for r in records])
    else:
        for r in records:
            print(f"imported function '{r.name}' (state: {r.state.value})")
    return 0


def register(sub: Any, add: Any) -> None:
    p = add("create", cmd_create, "save a function definition (JSON + handler file) without deploying it")
    p.add_argument("file")
    p = add(
        "deploy", cmd_deploy, "deploy a function: a definition file (saved first) or a stored function's name"
    )
    p.add_argument("function", help="NAME or path/to/definition.json")
    p.add_argument(
        "--boundary",
        choices=["everything", "from_now"],
        default=None,
        help="feed boundary: all mutations from seqno 0, or only new ones (default: the definition's)",
    )
    p = add("pause", cmd_pause, "pause a deployed function: workers checkpoint and stop")
    p.add_argument("function")
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a running service (default 60)"
    )
    p = add("resume", cmd_resume, "resume a paused function right after its checkpoints")
    p.add_argument("function")
    p = add("undeploy", cmd_undeploy, "undeploy a function: workers stop and checkpoints are dropped")
    p.add_argument("function")
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a running service (default 60)"
    )
    p = add("delete", cmd_delete, "delete an undeployed function's definition")
    p.add_argument("function")
    add("list", cmd_list, "list functions and their states")
    p = add("status", cmd_status, "function states and whether an eventing service is running")
    p.add_argument("function", nargs="?")
    p = add("export", cmd_export, "print a function definition with its handler source as JSON")
    p.add_argument("function")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument(
        "--format",
        choices=["eventing", "couchbase"],
        default="eventing",
        help="couchbase: Couchbase Eventing's export format (JavaScript functions), which Couchbase and "
        "`eventing import` read",
    )
    p.add_argument(
        "--with-secrets",
        action="store_true",
        help="write URL binding passwords and tokens in clear (default: masked as *****, which an "
        "import of the file keeps as they are stored)",
    )
    p = add(
        "import",
        cmd_import,
        "import function definitions exported with `eventing export`, or Couchbase "
        "Eventing's export (deployed, paused or undeployed as its settings say)",
    )
    p.add_argument("file")
