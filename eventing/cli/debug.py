"""`eventing debug FN`: run a function's stored handler in the foreground on a copy of its next mutation
(see eventing.ops.debugger). The mutation is never consumed: its worker still handles it in its place."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import TYPE_CHECKING

from eventing.cli.common import existing_state
from eventing.cli.output import emit_json
from eventing.core.wording import counted

if TYPE_CHECKING:
    from eventing.ops.debugger import DebugSession

EXIT_HANDLER_FAILED = 1
EXIT_INTERRUPTED = 130
WIDTH = 240  # trace values longer than this are cut, so one event stays on one line


def cmd_debug(args: argparse.Namespace) -> int:
    from eventing.ops.debugger import DebugSession

    state = existing_state(args)
    session = DebugSession(
        state,
        args.function,
        key=args.key,
        vb=args.vb,
        mode="pdb" if args.pdb else "trace",
        apply=args.apply,
        wait_s=args.wait,
        on_event=None if args.json else _print_event,
        pdb_stdout=sys.stderr if args.json else None,
    )
    restore = _default_sigint()
    try:
        outcome = session.run()
    except KeyboardInterrupt:
        _interrupted(session, args)
        return EXIT_INTERRUPTED
    finally:
        restore()
    if args.json:
        emit_json(session.report())
    else:
        _print_footer(session)
    return 0 if outcome.ok or outcome.status == "quit" else EXIT_HANDLER_FAILED


def _default_sigint():
    """Ctrl-C must raise KeyboardInterrupt here, even if this process inherited an ignored SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    return lambda: signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _interrupted(session: DebugSession, args: argparse.Namespace) -> None:

    pulled = session.pulled
    if pulled is None:
        message = "interrupted before a mutation was pulled; nothing was consumed"
    else:
        m = pulled.mutation
        message = (
            f"interrupted: the mutation (vBucket {m.vb} seqno {m.seqno}, key '{m.key}') was not consumed; "
            f"the worker that owns vBucket {m.vb} still handles it in its place, and nothing was applied"
        )
    if args.json:
        emit_json(session.report())
    print(message, file=sys.stderr)


def _print_event(event: dict) -> None:
    kind = event["event"]
    if kind == "pulled":
        m, cp = event["mutation"], event["checkpoint"]
        owner = (
            f"owner {cp['owner']}, {'live' if cp['leased'] else 'not running'}"
            if cp["owner"]
            else "never owned"
        )
        print(
            f"pulled a copy of vBucket {m['vb']} seqno {m['seqno']} (key '{m['key']}', {m['op']}) after "
            f"checkpoint {cp['seqno']} ({owner}); the stream keeps the original"
        )
    elif kind == "call":
        if event["doc"] is not None:
            print(f"doc:  {_value(event['doc'])}")
        if event["meta"] is not None:
            print(f"meta: {_value(event['meta'])}")
        if event["kind"]:
            print(f"calling {event['kind']}")
    elif kind == "log":
        print(f"  log     {event['line']}")
    elif kind == "read":
        print(f"  read    {event['alias']}[{event['key']!r}] -> {_value(event['value'])}")
    elif kind == "write":
        print(f"  write   {event['alias']}[{event['key']!r}] = {_value(event['value'])}")
    elif kind == "delete":
        print(f"  delete  {event['alias']}[{event['key']!r}]")
    sys.stdout.flush()


def _print_footer(session: DebugSession) -> None:

    outcome, pulled = session.outcome, session.pulled
    assert outcome is not None and pulled is not None
    ms = outcome.seconds * 1000
    if outcome.status == "ok":
        print(f"result: {outcome.kind} returned in {ms:.1f} ms")
    elif outcome.status == "no_handler":
        print("result: the handler defines no function for this operation; the worker skips it too")
    elif outcome.status == "filtered":
        print(
            "result: filtered out: the function's filter does not match this mutation, so the worker "
            "checkpoints it without calling the handler (counter `filtered`)"
        )
    elif outcome.status == "quit":
        print("result: pdb quit before the handler returned; its writes were discarded")
    else:
        print(f"result: {outcome.status}: {outcome.error}")
        if outcome.traceback:
            print(outcome.traceback.rstrip())
    writes = len(session.writes)
    if writes and session.applied:
        print(
            f"{counted(writes, 'write')} applied directly (origin '{session.function}'); the worker still "
            f"handles this mutation, so {'it' if writes == 1 else 'they'} may be applied twice"
        )
    elif writes:
        print(
            f"{counted(writes, 'write')} shown, not applied "
            f"(--apply writes {'it' if writes == 1 else 'them'})"
        )
    m = pulled.mutation
    print(
        f"the mutation was not consumed: the worker that owns vBucket {m.vb} handles seqno {m.seqno} in its "
        "place"
    )


def _value(value: object) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def register(sub, add) -> None:
    """Add `eventing debug` to the `eventing` parser."""
    p = add(
        "debug",
        cmd_debug,
        "run the stored handler in the foreground on a copy of the function's next mutation (after its "
        "checkpoint), with a trace or pdb; the mutation is never consumed: its worker still handles it in "
        "place",
    )
    p.add_argument("function")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--key", help="the first mutation of this key after the checkpoint of its vBucket")
    which.add_argument(
        "--vb", type=int, help="the next mutation of this vBucket (default: lowest with a backlog)"
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--pdb", action="store_true", help="run the handler under pdb (interactive)")
    how.add_argument(
        "--trace",
        action="store_true",
        help="non-interactive trace of doc, meta, logs, binding reads and writes, errors (default)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="write the handler's binding writes directly (origin = the function); the worker still "
        "handles the mutation, so they may be applied twice",
    )
    p.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="if no mutation is pending, poll the source this long for one",
    )
