"""What the mirror tests share: a data directory with a bucket, a source table, writers that record each
row's history in commit order, the service as a process of its own, and reading the collection's log."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import psycopg

from eventing.core.mutation import OP_UPDATE, decode_document
from eventing.storage.keyspace import key_prefix
from eventing.storage.mirror import definition as defs
from eventing.storage.state import open_state
from eventing.testing import wait_for
from metadata.factory import open_store


def new_data_dir(path: Path, *buckets: str) -> str:
    folder = str(path)
    open_store(folder).close()
    state = open_state(folder)
    for name in buckets:
        state.create_bucket(name, exist_ok=True).close()
    state.close()
    return folder


def make_table(url: str, name: str = "orders", rows: int = 100, *, extra: str = "") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY, rev int NOT NULL, note text, amount numeric{extra})"
        )
        if rows:
            conn.execute(
                f"INSERT INTO {name} SELECT g, 0, 'n' || g, 1.5 FROM generate_series(1, %s) g", (rows,)
            )


class Service:
    """`eventing run --executor in-process` as a process of its own (its followers are its children)."""

    def __init__(self, data_dir: str, log: Path):
        self.data_dir, self.log = data_dir, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        out = open(self.log, "a")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventing",
                "--data-dir",
                self.data_dir,
                "run",
                "--executor",
                "in-process",
                "--quiet",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def follower_status(data_dir: str, keyspace: str) -> dict:
    with open_store(data_dir) as store:
        return defs.status(store, keyspace)


def follower_pid(data_dir: str, keyspace: str, *, other_than: int | None = None) -> int:
    def found() -> int | None:
        status = follower_status(data_dir, keyspace)
        pid = status.get("pid")
        if status.get("state") == "following" and pid and pid != other_than and _alive(pid):
            return int(pid)
        return None

    return wait_for(found, f"the follower of {keyspace} follows its slot", timeout=120)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def collection_docs(data_dir: str, bucket: str, cid: int) -> dict[str, dict]:
    state = open_state(data_dir)
    try:
        with state.open_bucket(bucket) as b:
            prefix = key_prefix(cid)
            return {k[len(prefix) :]: doc for k, doc, _ in b.scan(prefix)}
    finally:
        state.close()


def collection_history(data_dir: str, bucket: str, cid: int) -> dict[str, list[tuple]]:
    """Per key of the collection, its log in seqno order: ("u", rev) or ("d",)."""
    prefix = key_prefix(cid)
    found: dict[str, list[tuple]] = defaultdict(list)
    state = open_state(data_dir)
    try:
        with state.open_bucket(bucket) as b:
            for batch in b.scan_log():
                for m in batch:
                    if m.key.startswith(prefix):
                        key = m.key[len(prefix) :]
                        found[key].append(
                            ("u", decode_document(m.doc)["rev"]) if m.op == OP_UPDATE else ("d",)
                        )
    finally:
        state.close()
    return found


def table_rows(url: str, name: str = "orders") -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {str(i): rev for i, rev in conn.execute(f"SELECT id, rev FROM {name}")}


class Writers:
    """Writers of a table, each owning its keys (so its order is the keys' commit order): updates of one to
    three rows a transaction, deletes, inserts, primary-key changes. ``history`` is every key's committed
    changes in commit order: ("u", rev) and ("d",)."""

    def __init__(self, url: str, keys: list[int], *, threads: int = 3, table: str = "orders", seed: int = 7):
        self.url, self.table = url, table
        self.history: dict[str, list[tuple]] = defaultdict(list)
        self.owned = [[k for k in keys if k % threads == i] for i in range(threads)]
        self.rev = dict.fromkeys(keys, 0)
        self.next_key = [10_000_000 + i for i in range(threads)]
        self.threads = threads
        self.go = threading.Event()
        self.go.set()
        self.done = threading.Event()
        self.commits = 0
        self.errors: list[BaseException] = []
        self.paused = threading.Event()
        self.seed = seed
        self._workers: list[threading.Thread] = []

    def start(self, transactions: int) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i, transactions), daemon=True)
            t.start()
            self._workers.append(t)

    def join(self) -> None:
        for t in self._workers:
            t.join()
        if self.errors:
            raise self.errors[0]

    def _run(self, i: int, transactions: int) -> None:
        rnd = random.Random(self.seed + i)
        try:
            conn = psycopg.connect(self.url, autocommit=True)
            for _ in range(transactions):
                self.go.wait()
                mine = self.owned[i]
                choice = rnd.random()
                with conn.transaction():
                    changes: list[tuple[str, tuple]] = []
                    if choice < 0.6 or len(mine) < 5:
                        for key in rnd.sample(mine, min(len(mine), rnd.randint(1, 3))):
                            self.rev[key] += 1
                            conn.execute(
                                f"UPDATE {self.table} SET rev = %s WHERE id = %s", (self.rev[key], key)
                            )
                            changes.append((str(key), ("u", self.rev[key])))
                    elif choice < 0.75:
                        key = rnd.choice(mine)
                        conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                        mine.remove(key)
                        changes.append((str(key), ("d",)))
                    elif choice < 0.9:
                        key = self.next_key[i] = self.next_key[i] + self.threads
                        self.rev[key] = 0
                        conn.execute(f"INSERT INTO {self.table}(id, rev, note) VALUES (%s, 0, 'new')", (key,))
                        mine.append(key)
                        changes.append((str(key), ("u", 0)))
                    else:  # a primary-key change: the old key's document goes, the new key's comes
                        old = rnd.choice(mine)
                        key = self.next_key[i] = self.next_key[i] + self.threads
                        self.rev[key] = self.rev[old]
                        conn.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s", (key, old))
                        mine.remove(old)
                        mine.append(key)
                        changes += [(str(old), ("d",)), (str(key), ("u", self.rev[key]))]
                for key, change in changes:  # committed: the keys' histories grow in commit order
                    self.history[key].append(change)
                self.commits += 1
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - the test raises it from join()
            self.errors.append(exc)


def wait_until_mirrored(
    data_dir: str, url: str, bucket: str, cid: int, *, table: str = "orders", timeout: float = 180
) -> None:
    want = table_rows(url, table)

    def same() -> bool:
        got = collection_docs(data_dir, bucket, cid)
        return {k: d["rev"] for k, d in got.items()} == want

    wait_for(same, f"the collection holds the {len(want)} rows of {table}", timeout=timeout, every=0.2)
