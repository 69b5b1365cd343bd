"""A throwaway PostgreSQL server on this machine, for tests, benchmarks and the docs: Debian's `postgresql`
package, `initdb` into a folder of its own, listening on 127.0.0.1 and a Unix socket in that folder, and
ending only the server it started (by its data directory, never by process name).

    server = ThrowawayPostgres()          # initdb into a new temporary folder (as `postgres` when root)
    server.start()                        # ~2 s; wal_level=logical, so tables can be mirrored
    url = server.create_database("t1")    # postgresql://postgres@127.0.0.1:PORT/t1
    server.kill()                         # kill -9 of the postmaster (fault tests); server.start() again
    server.stop()                         # pg_ctl stop -m immediate, then the folder goes

PostgreSQL refuses to run as root: where this process is root, every server command runs as the OS user
`postgres` (`runuser -u postgres --`) and the folder belongs to it. A standby (`add_standby`) is a
`pg_basebackup -R` of this server, streaming, listed in `synchronous_standby_names` when asked.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 60.0


def pg_bin_dir() -> Path | None:
    """The newest installed server's bin folder (/usr/lib/postgresql/N/bin), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable() -> str | None:
    """Why no throwaway server can run here (one line), or None."""
    if pg_bin_dir() is None:
        return (
            "PostgreSQL's server is not installed; install Debian's package (`apt-get install -y "
            "postgresql`, which scripts/setup.sh does when run as root)"
        )
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "PostgreSQL refuses to run as root and `runuser` is missing to run it as the `postgres` user"
    return None


def _server_parent() -> str | None:
    """Where a new server folder goes. As root the server runs as `postgres`, which must be able to reach
    its folder: $TMPDIR may be a private 0700 folder (the unit tests' is), so the folder then goes in a
    world-traversable one (/dev/shm in memory, else /tmp)."""
    if os.geteuid() != 0:
        return None
    for parent in ("/dev/shm", "/tmp"):
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            return parent
    return None


def _unreachable_parent(folder: Path) -> Path | None:
    """The first parent of `folder` that others cannot enter (so `postgres` could not reach it), or None."""
    for parent in folder.resolve().parents:
        if parent.exists() and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayPostgres:
    """One server in its own folder (see the module docstring)."""

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        fsync: bool = False,
        settings: dict[str, str] | None = None,
    ):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        found = pg_bin_dir()
        assert found is not None  # unavailable() said so otherwise
        self.bin: Path = found
        self._own_folder = folder is None
        self.folder = (
            Path(folder)
            if folder is not None
            else Path(tempfile.mkdtemp(prefix="eventing-pg-", dir=_server_parent()))
        )
        self.data = self.folder / "data"
        self.port = port or free_port()
        # fsync off by default: a kill -9 of the server loses nothing committed (the OS keeps the pages);
        # only a crash of the machine would. Benchmarks pass fsync=True.
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.standbys: list[ThrowawayPostgres] = []
        self._initialised = False

    # -- commands, as `postgres` where this process is root ------------------------------------------

    def _as_server_user(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            self._as_server_user(argv), capture_output=True, text=True, check=check, cwd="/"
        )

    def _give_to_server_user(self, path: Path) -> None:
        if os.geteuid() == 0:
            import pwd

            entry = pwd.getpwnam("postgres")
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def initdb(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        blocked = _unreachable_parent(self.folder) if os.geteuid() == 0 else None
        if blocked is not None:
            raise RuntimeError(
                f"the server folder {self.folder} is inside {blocked}, which the `postgres` user "
                f"cannot enter; choose a folder under /tmp or run `chmod o+x {blocked}`"
            )
        self._give_to_server_user(self.folder)
        os.chmod(self.folder, 0o700)
        done = self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip().splitlines()[-1:]}")
        self._configure()
        self._initialised = True

    def _configure(self) -> None:
        conf = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.folder}'",
            "wal_level": "logical",
            "max_wal_senders": "10",
            "max_replication_slots": "10",
            "max_connections": "200",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on",
            "full_page_writes": "on" if self.fsync else "off",
            "shared_buffers": "128MB",
            "logging_collector": "off",
        }
        conf.update(self.settings)
        text = "".join(f"{k} = {v}\n" for k, v in conf.items())
        with open(self.data / "postgresql.auto.conf", "a") as f:
            f.write(text)
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")

    # -- lifecycle ------------------------------------------------------------------------------------

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def start(self) -> str:
        """Start the server (initdb first if needed); returns the URL of the `postgres` database."""
        if not self._initialised and not (self.data / "PG_VERSION").exists():
            self.initdb()
        self._initialised = True
        done = self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(int(START_TIMEOUT_S)),
                "start",
            ],
            check=False,
        )
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:] if self.log.exists() else []
            raise RuntimeError(f"PostgreSQL did not start on port {self.port}: {' / '.join(tail)}")
        return self.url()

    def url(self, database: str = "postgres", *, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        """The postmaster's pid, from its data directory; None when it is not running."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def kill(self) -> None:
        """kill -9 of the postmaster, then of its children (as a crash of the server would end them)."""
        pid = self.pid()
        if pid is None:
            return
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_alive(pid) or any(_alive(c) for c in children)):
            time.sleep(0.02)
        # The postmaster is not our child: until init reaps it, it is a zombie whose pid PostgreSQL would
        # take for a live server holding the lock file. It is dead: its lock file goes.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        (self.folder / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)

    def stop(self, *, remove: bool = True) -> None:
        for standby in self.standbys:
            standby.stop(remove=remove)
        if self.running():
            self._run(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"], check=False
            )
            if self.running():
                self.kill()
        if remove and self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- databases and standbys ------------------------------------------------------------------------

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement with psql over the Unix socket; its output (tuples only)."""
        done = self._run(
            [
                str(self.bin / "psql"),
                "-h",
                str(self.folder),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-Atqc",
                statement,
            ],
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def create_database(self, name: str) -> str:
        # Over a connection of this process rather than psql: `runuser` and `psql` cost ~0.1-0.3 s of
        # processes a database, ten times the statement (the unit tests create a database in ~150 tests).
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=int(START_TIMEOUT_S)) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def add_user(self, name: str, password: str, *, superuser: bool = False) -> str:
        """A role that logs in over TCP with its password only (scram-sha-256: a wrong one is refused, where
        every other user is trusted); returns its URL of the `postgres` database, password included."""
        self.sql(f"CREATE ROLE \"{name}\" LOGIN {'SUPERUSER' if superuser else ''} PASSWORD '{password}'")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        self.sql("SELECT pg_reload_conf()")
        return f"postgresql://{name}:{password}@127.0.0.1:{self.port}/postgres"

    def add_standby(self, *, synchronous: bool = True, name: str = "standby1") -> ThrowawayPostgres:
        """A streaming standby of this server (pg_basebackup -R), started; with `synchronous`, commits
        on this server wait for it (synchronous_standby_names)."""
        standby = ThrowawayPostgres(self.folder / name, fsync=self.fsync)
        standby._own_folder = False
        standby.folder.mkdir(parents=True, exist_ok=True)
        standby._give_to_server_user(standby.folder)
        os.chmod(standby.folder, 0o700)
        done = self._run(
            [
                str(self.bin / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-D",
                str(standby.data),
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "--checkpoint=fast",
                "-d",
                f"host=127.0.0.1 port={self.port} user=postgres application_name={name}",
            ],
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {done.stderr.strip()}")
        with open(standby.data / "postgresql.auto.conf", "a") as f:
            f.write(f"port = {standby.port}\nunix_socket_directories = '{standby.folder}'\n")
        standby._initialised = True
        standby.start()
        self.standbys.append(standby)
        if synchronous:
            self.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            self.sql("SELECT pg_reload_conf()")
            deadline = time.monotonic() + START_TIMEOUT_S
            while (
                self.sql(f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'")
                != "sync"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"standby {name} did not become synchronous")
                time.sleep(0.05)
        return standby

    def promote(self) -> None:
        done = self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "promote"], check=False)
        if done.returncode != 0:
            raise RuntimeError(f"promote failed: {done.stderr.strip()}")

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                if int(f.read().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m eventing.testing.postgres start|stop|kill|standby|promote|url|failover-url --folder DIR`: a
    throwaway server for trying the PostgreSQL store out (docs/postgresql.md), known by DIR; `start` prints
    its URL, `standby` starts a synchronous standby of it, `failover-url` prints a URL naming both, `stop`
    ends both and deletes their files. As root the server's files are in a folder of the system's temporary
    folder the `postgres` user can reach (DIR may be under a folder only root can open); DIR holds where."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m eventing.testing.postgres", description=main.__doc__)
    parser.add_argument(
        "action", choices=["start", "stop", "kill", "standby", "promote", "url", "failover-url"]
    )
    parser.add_argument("--folder", required=True, help="the folder that knows the server (created by start)")
    parser.add_argument("--port", type=int, default=None, help="its port (start: a free one by default)")
    parser.add_argument("--database", default="eventing", help="a database start creates (default eventing)")
    parser.add_argument("--fsync", action="store_true", help="flush to disk as a production server does")
    args = parser.parse_args(argv)
    handle = Path(args.folder).resolve()
    info_file = handle / HANDLE_FILE
    info = json.loads(info_file.read_text()) if info_file.exists() else {}
    if not info:
        if args.action != "start":
            parser.error(f"no throwaway server is known by {handle}; `start` one first")
        handle.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            where = tempfile.mkdtemp(prefix="eventing-pg-", dir=_server_parent())
        else:
            where = str(handle / "server")
        info = {"server": where, "port": args.port or free_port(), "fsync": args.fsync}
        info_file.write_text(json.dumps(info))
    server = _known(info)
    if args.action == "start":
        if not server.running():
            server.start()
        if not server.sql(f"SELECT 1 FROM pg_database WHERE datname = '{args.database}'"):
            server.create_database(args.database)
        print(server.url(args.database))
    elif args.action == "url":
        print(server.url(args.database))
    elif args.action == "failover-url":  # both servers; libpq takes the one that accepts writes
        print(
            f"postgresql://postgres@127.0.0.1:{server.port},127.0.0.1:{info['standby']['port']}/{args.database}"
            "?target_session_attrs=read-write"
        )
    elif args.action == "kill":
        server.kill()
    elif args.action == "stop":
        if "standby" in info:
            _known(info["standby"]).stop(remove=False)
        server.stop(remove=False)
        shutil.rmtree(info["server"], ignore_errors=True)
        info_file.unlink()
    elif args.action == "standby":
        standby = server.add_standby(name="standby1")
        info["standby"] = {"server": str(standby.folder), "port": standby.port, "fsync": server.fsync}
        info_file.write_text(json.dumps(info))
        print(standby.url(args.database))
    elif args.action == "promote":
        _known(info["standby"]).promote()
    return 0


HANDLE_FILE = "throwaway.json"


def _known(info: dict) -> ThrowawayPostgres:
    server = ThrowawayPostgres(info["server"], port=int(info["port"]), fsync=bool(info.get("fsync")))
    server._initialised = (server.data / "PG_VERSION").exists()
    return server


if __name__ == "__main__":
    raise SystemExit(main())
