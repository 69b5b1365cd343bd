"""A lifecycle model and driver for property tests: random sequences of lifecycle operations (load, deploy,
pause, edit, resume, undeploy, rewind, dead-letter replay, run, backup, restore) applied to a real data
directory and to a plain model of what each deployment owes, checked against each other after every step.

The function under test writes a ledger through its read-write binding `ledger`, tagged with its
deployment: `e|<function>#<tag>|<key>|<seqno>` per handled mutation and `h|<function>#<tag>|<key>`, the
document's history (the source seqnos in the order their effects applied). Each deployment gets a new tag
(the constant TAG), so one ledger bucket holds every deployment's effects apart. The handler is one of
HANDLERS: `ledger` and `fixed` handle everything; `bad` raises for documents marked `bad`; `hang` loops
forever for documents marked `hang` (each such call costs the execution_timeout: 300 ms in process, 1 s
on Ray).

What the model promises, from docs/guarantees.md, docs/functions.md, docs/dlq-and-debugging.md and
eventing.ops.rewind / eventing.ops.backup:
- a deployment owes every mutation after its feed boundary (`everything`: seqno 0; `from_now`: the high
  seqno of its vBucket at deploy time), every version, deletes included, in per-document seqno order;
- a mutation its handler handles has exactly one effect under that deployment's tag, whatever pauses,
  edits, rewinds (effect marks kept), replays and restores come after;
- a mutation its handler fails on (raise, timeout) is a pending dead letter with no effect: never silently
  skipped; a replay with a handler that succeeds gives it its one effect;
- a rewound range runs again: a mutation already handled keeps its one effect, one that was dead-lettered
  may be handled now or stay a dead letter;
- a restored metadata store resumes after the restored checkpoints; effects already in the ledger stay
  exactly once.
`check()` returns the violations found, each classified (see Violation.kind).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventing.api import Eventing
from eventing.cli.app import main as cli_main
from eventing.control import lifecycle
from eventing.errors import EventingError, LifecycleError, NotFoundError
from eventing.ops.verify import EFFECT, HISTORY, parse_effect_key
from eventing.storage.factory import open_bucket
from eventing.storage.protocol import FileBucket
from metadata.factory import open_store
from sharding import vbucket_of

FUNCTION = "fn_life"
SOURCE = "life_src"
LEDGER = "life_ledger"
KEYS = tuple(f"doc{i}" for i in range(6))
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_RECORD = """
import os

def _record(meta, op):
    name = f"{FUNCTION}#{TAG}"
    ledger[f"e|{name}|{meta.id}|{meta.seq}"] = {
        "key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": op, "tag": TAG, "handler": VERSION, "pid": os.getpid()}
    history = ledger.get(f"h|{name}|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{name}|{meta.id}"] = history

def on_delete(meta, options):
    _record(meta, "delete")
"""  # noqa: E501

HANDLERS: dict[str, str] = {
    "ledger": 'VERSION = "ledger"\n'
    + _RECORD
    + """
def on_update(doc, meta):
    _record(meta, "update")
""",
    "bad": 'VERSION = "bad"\n'
    + _RECORD
    + """
def on_update(doc, meta):
    if doc.get("bad"):
        raise ValueError(f"document {meta.id} is marked bad")
    _record(meta, "update")
""",
    "hang": 'VERSION = "hang"\n'
    + _RECORD
    + """
def on_update(doc, meta):
    if doc.get("hang"):
        while True:
            pass
    _record(meta, "update")
""",
    "fixed": 'VERSION = "fixed"\n'
    + _RECORD
    + """
def on_update(doc, meta):
    _record(meta, "update")
""",
}


def outcome(handler: str, m: Mut) -> str:
    """What `handler` does with mutation `m`: ok, error or timeout."""
    if m.op == "update" and m.flag == "bad" and handler == "bad":
        return "error"
    if m.op == "update" and m.flag == "hang" and handler == "hang":
        return "timeout"
    return "ok"


@dataclass(frozen=True)
class Mut:
    key: str
    vb: int
    seq: int
    op: str  # update | delete
    flag: str  # "" | bad | hang (updates only)


@dataclass
class Deployment:
    tag: int
    boundary: str
    start: dict[int, int]  # vb -> feed boundary seqno
    processed: dict[int, int]  # vb -> the checkpoint the model expects
    status: dict[tuple[int, int], str] = field(default_factory=dict)  # (vb, seq) -> effect | dead


@dataclass
class DeadLetter:
    key: str
    pending: bool
    reason: str
    tag: int  # the deployment that last dead-lettered it


@dataclass
class Violation:
    kind: str  # duplicate | missing | unexpected | dead_letter_missing | order | state | checkpoint
    # | timeout_skip | stale_replay | replay_rerun (KNOWN_ISSUES)
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class ModelState:
    """Everything the metadata store holds, as the model sees it (a backup copies it, a restore brings it
    back). Effects in the ledger are not here: the ledger bucket is not part of a backup."""

    state: str = "none"  # none | undeployed | deployed | paused
    handler: str = "ledger"
    settings: dict[str, Any] = field(
        default_factory=lambda: {"worker_count": 2, "batch_size": 100, "retries": 0}
    )
    deployment: Deployment | None = None
    dlq: dict[tuple[int, int], DeadLetter] = field(default_factory=dict)


def _effects(ledger: FileBucket) -> list[tuple[int, str, int]]:
    """(tag, key, seqno) of every effect the ledger holds."""
    out = []
    for text in ledger.logged_writes(f"{EFFECT}{FUNCTION}#"):
        parsed = parse_effect_key(text)
        assert parsed is not None, text
        out.append((int(parsed[0].rpartition("#")[2]), parsed[1], parsed[2]))
    return out


class LifecycleDriver:
    """Applies steps to a data directory (through the Python API, the lifecycle functions and the CLI) and
    to the model; `check()` compares them. Steps are tuples, see `apply`."""

    def __init__(
        self, data_dir: str | Path, *, executor: str = "in-process", known: frozenset[str] = frozenset()
    ):
        self.data_dir = str(data_dir)
        self.app = Eventing(self.data_dir, executor=executor)  # type: ignore[arg-type]
        self.app.create_bucket(SOURCE)
        self.app.create_bucket(LEDGER)
        self.model = ModelState()
        # Open issues a test chooses to tolerate (see KNOWN_ISSUES); what they excused is kept in `excused`.
        self.known = known
        self.stale_replays: set[tuple[int, str, int]] = (
            set()
        )  # (tag, key, seqno) a stale letter's replay applied again
        self.excused: list[Violation] = []
        self.muts: list[Mut] = []
        self.live: set[str] = set()
        self.rev = 0
        self.next_tag = 1
        self.must: dict[int, set[tuple[str, int]]] = defaultdict(
            set
        )  # tag -> effects that must be in the ledger
        self.may: dict[int, set[tuple[str, int]]] = defaultdict(
            set
        )  # tag -> effects that may appear (resolved by check)
        # tag -> (key, seq) whose effect a replay applied: it lands after later versions' effects
        # (documented), so the per-document order check leaves it out
        self.replayed: dict[int, set[tuple[str, int]]] = defaultdict(set)
        self.backup: tuple[str, ModelState] | None = None
        self.log: list[str] = []

    # -- the definition ---------------------------------------------------------------------------------

    # What a `hang` call costs. In process 300 ms is plenty for the other calls; ServiceDriver gives Ray
    # workers on a loaded machine more.
    execution_timeout = "300ms"

    def definition(self, tag: int) -> dict[str, Any]:
        return {
            "name": FUNCTION,
            "source_bucket": SOURCE,
            "bindings": [{"alias": "ledger", "bucket": LEDGER, "access": "rw"}],
            "constants": {"FUNCTION": FUNCTION, "TAG": tag},
            "checkpoint_interval": "100ms",
            "execution_timeout": self.execution_timeout,
            "retry_backoff": "10ms",
            **self.model.settings,
        }

    # -- steps ------------------------------------------------------------------------------------------

    def apply(self, step: tuple) -> None:
        self.log.append(repr(step))
        getattr(self, f"step_{step[0]}")(*step[1:])

    def step_load(self, ops: list[tuple[int, str]]) -> None:
        """ops: (key index, kind) with kind plain | bad | hang | delete (a delete of a missing key
        upserts)."""
        for index, kind in ops:
            key = KEYS[index % len(KEYS)]
            if kind == "delete" and key in self.live:
                vb, seq = self.app.remove(SOURCE, key)
                self.live.discard(key)
                self.muts.append(Mut(key, vb, seq, "delete", ""))
                continue
            self.rev += 1
            flag = kind if kind in ("bad", "hang") else ""
            doc: dict[str, Any] = {"rev": self.rev}
            if flag:
                doc[flag] = True
            vb, seq = self.app.upsert(SOURCE, key, doc)
            self.live.add(key)
            self.muts.append(Mut(key, vb, seq, "update", flag))

    def _highs(self) -> dict[int, int]:
        highs: dict[int, int] = {}
        for m in self.muts:
            highs[m.vb] = max(highs.get(m.vb, 0), m.seq)
        return highs

    def step_deploy(self, boundary: str) -> None:
        st = self.model
        if st.state in ("none", "undeployed"):
            tag = self.next_tag
            self.next_tag += 1
            self.app.deploy(self.definition(tag), HANDLERS[st.handler], boundary=boundary)  # type: ignore[arg-type]
            start = self._highs() if boundary == "from_now" else {}
            st.deployment = Deployment(tag, boundary, dict(start), dict(start))
            st.state = "deployed"
        else:
            self._expect_refused(lambda: lifecycle.deploy(self.data_dir, FUNCTION, boundary))  # type: ignore[arg-type]

    def step_pause(self) -> None:
        if self.model.state == "deployed":
            self.app.pause(FUNCTION)
            self.model.state = "paused"
        else:
            self._expect_refused(lambda: self.app.pause(FUNCTION))

    def step_resume(self) -> None:
        if self.model.state == "paused":
            self.app.resume(FUNCTION)
            self.model.state = "deployed"
        else:
            self._expect_refused(lambda: self.app.resume(FUNCTION))

    def step_undeploy(self) -> None:
        if self.model.state in ("deployed", "paused"):
            self.app.undeploy(FUNCTION)
            self.model.state = "undeployed"
            self.model.deployment = None
        else:
            self._expect_refused(lambda: self.app.undeploy(FUNCTION))

    def step_edit(self, handler: str, settings: dict[str, Any]) -> None:
        """Save a new handler and settings (`eventing create`): while paused or undeployed; refused while
        deployed."""
        st = self.model
        tag = st.deployment.tag if st.deployment else 0
        if st.state == "deployed":
            new = copy.deepcopy(st.settings)
            new.update(settings)
            defn = {**self.definition(tag), **new}
            self._expect_refused(lambda: self.app.save(defn, HANDLERS[handler]))
            return
        st.handler = handler
        st.settings.update(settings)
        self.app.save(self.definition(tag), HANDLERS[handler])
        if st.state == "none":
            st.state = "undeployed"

    def step_run(self) -> None:
        """Run until caught up (the in-process executor: one call, every deployed function)."""
        summary = self.app.run(until_caught_up=True)
        if summary.errors:
            raise AssertionError(f"run reported errors: {summary.errors}")
        self.model_run()

    def model_run(self) -> None:
        """What a run until caught up does to the model: the deployed function handles every mutation
        after its checkpoints with its current handler."""
        st = self.model
        d = st.deployment
        if st.state != "deployed" or d is None:
            return
        highs = self._highs()
        for m in sorted(self.muts, key=lambda m: (m.vb, m.seq)):
            if m.seq > d.processed.get(m.vb, 0):
                self._stream(d, m)
        d.processed.update(highs)

    def _stream(self, d: Deployment, m: Mut) -> None:
        st = self.model
        ident = (m.vb, m.seq)
        status = d.status.get(ident)
        result = outcome(st.handler, m)
        if result == "ok":
            if status is None:
                self.must[d.tag].add((m.key, m.seq))
                d.status[ident] = "effect"
            elif status == "dead":
                self.may[d.tag].add(
                    (m.key, m.seq)
                )  # a rewound dead letter: handled now or still a dead letter
        else:
            if status is None:
                d.status[ident] = "dead"
            letter = st.dlq.get(ident)
            if letter is None or not letter.pending:
                st.dlq[ident] = DeadLetter(m.key, True, result, d.tag)

    def step_rewind(self, to_seqno: int) -> None:
        """`eventing rewind FN --to-seqno N` (effect marks kept): only a paused function; refused below a
        from_now boundary."""
        st = self.model
        d = st.deployment
        code, out = self.cli("rewind", FUNCTION, "--to-seqno", str(to_seqno))
        if st.state != "paused" or d is None:
            self._expect_exit(code, EXIT_USAGE, out)
            return
        moves = {vb: to_seqno for vb, seq in d.processed.items() if to_seqno < seq}
        refused = any(to_seqno < d.start.get(vb, 0) for vb in moves)
        self._expect_exit(code, EXIT_USAGE if refused else EXIT_OK, out)
        if not refused:
            d.processed.update(moves)

    def step_replay(self) -> None:
        """`eventing dlq replay FN --all` with the current handler, while deployed or paused."""
        st = self.model
        d = st.deployment
        if d is None:
            return
        code, out = self.cli("dlq", "replay", FUNCTION, "--all")
        failed = False
        for ident, letter in sorted(st.dlq.items()):
            if not letter.pending:
                continue
            m = next(x for x in self.muts if (x.vb, x.seq) == ident)
            result = outcome(st.handler, m)
            if result != "ok":
                failed = True
                continue
            letter.pending = False
            if d.status.get(ident) == "effect" and self.known & {"stale_replay", "replay_rerun"}:
                # the letter's mutation already has its effect: a replay applies it again (see KNOWN_ISSUES)
                if letter.tag != d.tag:
                    self.stale_replays.add((d.tag, m.key, m.seq))
                self.replayed[d.tag].add((m.key, m.seq))
            elif d.status.get(ident) != "effect":
                self.must[d.tag].add((m.key, m.seq))
                self.may[d.tag].discard((m.key, m.seq))
                d.status[ident] = "effect"
                self.replayed[d.tag].add((m.key, m.seq))
        self._expect_exit(code, EXIT_FAILED if failed else EXIT_OK, out)

    def step_complete(self) -> None:
        """Assert that the deployed function owes nothing: every mutation after its boundary has its effect
        (run after a fixed handler and a replay, or a fresh deployment)."""
        d = self.model.deployment
        if d is None or self.model.state != "deployed":
            return
        owed = {(m.key, m.seq) for m in self.muts if m.seq > d.start.get(m.vb, 0)}
        ledger = open_bucket(self.data_dir, LEDGER)
        try:
            got = {(k, s) for t, k, s in _effects(ledger) if t == d.tag}
        finally:
            ledger.close()
        left = sorted(owed - got)
        if left:
            raise AssertionError(
                f"{self.log[-1]}: deployment {d.tag} has not handled {len(left)} mutations it owes, e.g. "
                f"{left[:3]}"
            )

    def step_backup(self) -> None:
        path = str(Path(self.data_dir) / f"backup-{len(self.log)}.sqlite3")
        if self.model.state == "none":
            return
        code, out = self.cli("backup", "-o", path)
        self._expect_exit(code, EXIT_OK, out)
        self.backup = (path, copy.deepcopy(self.model))

    def step_restore(self) -> None:
        if self.backup is None:
            return
        path, snapshot = self.backup
        code, out = self.cli("restore", path)
        self._expect_exit(code, EXIT_OK, out)
        restored = copy.deepcopy(snapshot)
        d = restored.deployment
        if d is not None:  # what the ledger holds of this deployment since the backup stays: handled once
            for m in self.muts:
                if (m.key, m.seq) in self.must[d.tag]:
                    d.status[(m.vb, m.seq)] = "effect"
        self.model = restored

    # -- checking ---------------------------------------------------------------------------------------

    def check(self) -> list[Violation]:
        """Compare the data directory with the model; resolve the model's open choices by what happened."""
        found: list[Violation] = []
        ledger = open_bucket(self.data_dir, LEDGER)
        store = open_store(self.data_dir, create=False) if self.model.state != "none" else None
        try:
            writes = ledger.logged_writes(EFFECT)
            actual: dict[int, set[tuple[str, int]]] = defaultdict(set)
            for text, count in writes.items():
                parsed = parse_effect_key(text)
                assert parsed is not None, text
                fn, key, seq = parsed
                tag = int(fn.rpartition("#")[2])
                actual[tag].add((key, seq))
                if count > 1:
                    kind = "duplicate"
                    if count == 2 and (tag, key, seq) in self.stale_replays:
                        kind = "stale_replay"
                    elif count == 2 and (key, seq) in self.replayed[tag]:
                        kind = "replay_rerun"
                    found.append(Violation(kind, f"{text} written {count} times"))
            letters = (
                {(r.vb, r.seqno): r for r in store.dlq_rows(FUNCTION, include_replayed=True)} if store else {}
            )
            d = self.model.deployment
            for tag in sorted(set(self.must) | set(actual)):
                must, may, got = self.must[tag], self.may[tag], actual[tag]
                for key, seq in sorted(must - got):
                    vb = vbucket_of(key)
                    row = letters.get((vb, seq))
                    letter = self.model.dlq.get((vb, seq))
                    if (
                        d is not None
                        and tag == d.tag
                        and row is not None
                        and row.reason == "timeout"
                        and row.replayed_at is None
                        and letter is not None
                        and letter.tag != tag
                    ):
                        found.append(
                            Violation(
                                "timeout_skip",
                                f"{key}@{vb}:{seq} not handled by deployment {tag}: a timeout dead letter of "
                                f"deployment {letter.tag} made its worker skip it",
                            )
                        )
                        continue
                    found.append(
                        Violation("missing", f"{key}@{vb}:{seq} has no effect under deployment {tag}")
                    )
                for key, seq in sorted(got - must - may):
                    found.append(
                        Violation(
                            "unexpected", f"{key}@{seq}: an effect under deployment {tag} it does not owe"
                        )
                    )
            if d is not None:
                for (vb, seq), status in sorted(d.status.items()):
                    if status == "dead":
                        m_key = self.model.dlq[(vb, seq)].key if (vb, seq) in self.model.dlq else "?"
                        handled = (m_key, seq) in actual[d.tag]
                        row = letters.get((vb, seq))
                        if not handled and (row is None or row.replayed_at is not None):
                            found.append(
                                Violation(
                                    "dead_letter_missing",
                                    f"{m_key}@{vb}:{seq} failed under deployment {d.tag} but is neither "
                                    "handled nor a pending dead letter",
                                )
                            )
            for tag in sorted(actual):
                replayed = self.replayed[tag]
                for text, history, _meta in ledger.scan(f"{HISTORY}{FUNCTION}#{tag}|"):
                    key = text.rpartition("|")[2]
                    seqs = [s for s in history.get("seqs", []) if (key, s) not in replayed]
                    if any(b <= a for a, b in zip(seqs, seqs[1:], strict=False)):
                        found.append(
                            Violation("order", f"deployment {tag} handled {key} out of order: {seqs}")
                        )
            if store is not None:
                found.extend(self._check_store(store))
        finally:
            ledger.close()
            if store is not None:
                store.close()
        self._resolve()
        self.excused.extend(v for v in found if v.kind in self.known)
        return [v for v in found if v.kind not in self.known]

    def _check_store(self, store: Any) -> list[Violation]:
        found = []
        record = store.get_function(FUNCTION)
        if record.state.value != self.model.state:
            found.append(
                Violation("state", f"function is {record.state.value}, the model says {self.model.state}")
            )
        d = self.model.deployment
        if d is not None and self.model.state in ("deployed", "paused"):
            cps = store.checkpoints(FUNCTION)
            for vb in sorted({m.vb for m in self.muts}):
                want = d.processed.get(vb, 0)
                got = cps[vb].seqno if vb in cps else None
                if got != want:
                    found.append(
                        Violation("checkpoint", f"vBucket {vb} checkpoint {got}, the model says {want}")
                    )
        return found

    def _resolve(self) -> None:
        """Settle the model's open choices by what happened: a rewound dead letter handled now is an
        effect from now on, one not handled stays a dead letter."""
        ledger = open_bucket(self.data_dir, LEDGER)
        try:
            d = self.model.deployment
            for tag, may in self.may.items():
                for key, seq in may:
                    if ledger.logged_writes(f"{EFFECT}{FUNCTION}#{tag}|{key}|{seq}"):
                        self.must[tag].add((key, seq))
                        if d is not None and d.tag == tag:
                            d.status[(vbucket_of(key), seq)] = "effect"
                may.clear()
        finally:
            ledger.close()

    # -- helpers ----------------------------------------------------------------------------------------

    def cli(self, *argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main([*argv, "--data-dir", self.data_dir])
        return code, (out.getvalue() + err.getvalue()).strip()

    def _expect_exit(self, code: int, want: int, out: str) -> None:
        if code != want:
            raise AssertionError(f"{self.log[-1]}: exit status {code}, expected {want}: {out[-500:]}")
        if code == EXIT_USAGE and (len(out.splitlines()) != 1 or "Traceback" in out):
            raise AssertionError(f"{self.log[-1]}: a refusal must be one line, got: {out[-500:]}")

    def _expect_refused(self, action: Any) -> None:
        try:
            action()
        except NotFoundError as exc:
            if self.model.state != "none":
                raise AssertionError(f"{self.log[-1]}: {exc}") from None
            return
        except LifecycleError as exc:
            if "\n" in str(exc):
                raise AssertionError(f"{self.log[-1]}: the refusal is not one line: {exc}") from None
            return
        except EventingError as exc:
            raise AssertionError(
                f"{self.log[-1]}: refused with {type(exc).__name__}, not LifecycleError: {exc}"
            ) from None
        raise AssertionError(f"{self.log[-1]}: accepted in state {self.model.state}, expected a refusal")

    def describe(self) -> str:
        return json.dumps(self.log)


FINALE: tuple[tuple, ...] = (
    # Fix the handler and replay every dead letter: the deployment has handled everything it owes.
    ("pause",),
    ("edit", "fixed", {}),
    ("replay",),
    ("resume",),
    ("run",),
    ("complete",),
    # A fresh deployment from `everything` handles every mutation of the log, whatever came before.
    ("undeploy",),
    ("deploy", "everything"),
    ("run",),
    ("complete",),
)


# Open issues found by this model, by the kind of violation they cause; a test may pass some as `known` so
# that the rest of the model keeps running while they are fixed (the kept examples check them strictly).
KNOWN_ISSUES = {
    "stale_replay": (
        "a dead letter of an earlier deployment stays pending after a later deployment handled its mutation; "
        "`dlq replay` then applies that mutation's effects a second time under the later deployment"
    ),
    "replay_rerun": (
        "a dead letter replayed and a rewind over its mutation (either order) apply its effects twice: the "
        "replay's effect marks are per letter, the stream's per vBucket, and neither sees the other"
    ),
}


def run_steps(
    data_dir: str | Path,
    steps: list[tuple] | tuple[tuple, ...],
    *,
    executor: str = "in-process",
    finale: bool = True,
    known: frozenset[str] = frozenset(),
) -> LifecycleDriver:
    """Apply `steps`, then run until caught up (and the FINALE); fail with the violations found after the
    first step that shows any, naming the steps so far."""
    driver = LifecycleDriver(data_dir, executor=executor, known=known)
    for step in [*steps, ("run",), *(FINALE if finale else ())]:
        driver.apply(step)
        problems = driver.check()
        if problems:
            shown = "; ".join(str(p) for p in problems[:5])
            raise AssertionError(f"after {driver.describe()}: {len(problems)} violations: {shown}")
    return driver


class ServiceDriver(LifecycleDriver):
    """The same steps against an `eventing run` subprocess on a Ray instance (eventing.testing.cluster's
    ServiceProcess), plus kill -9 of a worker process and of the service. After every step the driver waits
    until the deployed function has caught up, so the model knows which handler handled what (a handler
    changes only while paused, and a pause waits for the service to checkpoint). Restore is left out: it
    is refused while a service runs."""

    execution_timeout = "1s"

    def __init__(
        self,
        data_dir: str | Path,
        ray_address: str,
        *,
        known: frozenset[str] = frozenset(),
        catch_up_s: float = 60.0,
    ):
        super().__init__(data_dir, executor="ray", known=known)
        self.ray_address = ray_address
        self.catch_up_s = catch_up_s
        self.service: Any = None
        self.kills = {"worker": 0, "service": 0}
        # `eventing run` refuses a directory with no metadata store (a mistyped --data-dir); the first
        # deploy may come after the service looked, so the store exists before it starts.
        open_store(self.data_dir, create=True).close()
        self.start_service()

    def start_service(self) -> None:
        from eventing.testing.cluster import ServiceProcess

        self.service = ServiceProcess(
            self.data_dir, self.ray_address, log_name=f"service{sum(self.kills.values())}"
        )

    def close(self) -> None:
        if self.service is not None:
            self.service.end()

    def apply(self, step: tuple) -> None:
        super().apply(step)
        self.wait_caught_up()

    def step_run(self) -> None:
        self.wait_caught_up()

    def step_restore(self) -> None:
        pass

    def step_kill_worker(self) -> None:
        """kill -9 the worker process that wrote the newest effect (a Ray worker of this instance)."""
        import os
        import signal

        ledger = open_bucket(self.data_dir, LEDGER)
        try:
            pids = [
                doc.get("pid")
                for _, doc, meta in sorted(
                    ledger.scan(f"{EFFECT}{FUNCTION}#"), key=lambda item: -item[2]["seqno"]
                )
            ]
        finally:
            ledger.close()
        for pid in pids:
            if not pid or pid == os.getpid() or not Path(f"/proc/{pid}").exists():
                continue  # a replay runs the handler in this process
            cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            if cmdline.startswith("ray::") or "default_worker" in cmdline:
                os.kill(pid, signal.SIGKILL)
                self.kills["worker"] += 1
                return

    def step_kill_service(self) -> None:
        """kill -9 the service, then start another one, as an operator would."""
        self.service.kill()
        self.kills["service"] += 1
        self.start_service()

    def wait_caught_up(self) -> None:
        """Until the deployed function's checkpoints reach the source's high seqnos; then the model runs."""
        import time

        if self.model.state != "deployed" or self.model.deployment is None:
            return
        want = self._highs()
        deadline = time.monotonic() + self.catch_up_s
        while True:
            store = open_store(self.data_dir, create=False)
            try:
                cps = store.checkpoints(FUNCTION)
            finally:
                store.close()
            if all(vb in cps and cps[vb].seqno >= seq for vb, seq in want.items()):
                break
            if time.monotonic() > deadline or self.service.proc.poll() is not None:
                raise AssertionError(
                    f"{self.log[-1]}: not caught up after {self.catch_up_s:.0f}s (service exit "
                    f"{self.service.proc.poll()}): {self.service.log.read_text()[-2000:]}"
                )
            time.sleep(0.05)
        self.model_run()
