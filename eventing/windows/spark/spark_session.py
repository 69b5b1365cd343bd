"""The one SparkSession each process shares for windowed aggregation."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
MASTER_ENV = "EVENTING_SPARK_MASTER"
LOG_LEVEL_ENV = "EVENTING_SPARK_LOG_LEVEL"

# Spark's default of 200 shuffle partitions means 200 small tasks per shuffle stage and 200 state stores per
# Structured Streaming stateful operator; on 2 cores 4 keeps both cores busy without that overhead.
SHUFFLE_PARTITIONS = 4

_LOG4J2_PROPERTIES = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# PySpark's gateway counts as a shell: unless its logger has the root's level, Spark prints a
# "Setting default log level" banner at start-up.
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""

_lock = threading.Lock()
_session: SparkSession | None = None
_master: str | None = None


def _log4j2_config(level: str) -> Path:
    """A log4j2 file at ``level``, handed to the driver JVM at launch so even start-up chatter obeys it."""
    text = _LOG4J2_PROPERTIES.format(level=level.lower())
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"eventing-spark-log4j2-{digest}.properties"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


MASTER_CHECK_TIMEOUT_S = 3.0


def check_spark_master(master: str, timeout: float = MASTER_CHECK_TIMEOUT_S) -> None:
    """Fail fast, in one line, when a ``spark://`` (or ``sc://``) master does not answer: Spark's own driver
    would retry registering for a minute before giving up with a page of log. Other masters pass."""
    import socket
    from urllib.parse import urlsplit

    from eventing.errors import ConfigError

    if not master.startswith(("spark://", "sc://")):
        return
    first = master.split("://", 1)[1].split(",")[0]  # a standalone HA list tries its first master first
    parts = urlsplit(f"//{first}")
    host, port = parts.hostname, parts.port or (15002 if master.startswith("sc://") else 7077)
    try:
        with socket.create_connection((host or "", port), timeout=timeout):
            pass
    except OSError as exc:
        raise ConfigError(
            f"no Spark master answers at {master} ({exc.strerror or exc}); start it (`spark-class "
            f"org.apache.spark.deploy.master.Master --host {host} --port {port}`) or fix --spark-master / "
            f"${MASTER_ENV}"
        ) from None


def get_spark(master: str | None = None) -> SparkSession:
    """Return this process's SparkSession, starting it on first use (a cold start takes ~10 s on 2 cores).

    ``master`` defaults to ``$EVENTING_SPARK_MASTER`` or ``local[*]``. Asking for a different master than the
    running session's is an error: call ``stop_spark()`` first.
    """
    global _session, _master
    wanted = master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
    with _lock:
        if _session is not None:
            if master is not None and master != _master:
                raise RuntimeError(
                    f"a Spark session is already running on {_master!r}; call stop_spark() before asking "
                    f"for {master!r}"
                )
            return _session
        # Python workers must run this interpreter (the venv with pyarrow), not whatever `python` is on PATH;
        # an explicit setting (a cluster whose executors keep Python elsewhere) wins.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        check_spark_master(wanted)
        if wanted.startswith("sc://"):
            _session, _master = _connect(wanted), wanted
            return _session
        log_level = os.environ.get(LOG_LEVEL_ENV, "ERROR").upper()
        if wanted.startswith("local"):
            # Bind the local driver to loopback: nothing outside this machine should reach it, and Spark
            # stops warning that the hostname resolves to 127.0.0.1.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings = {
            "spark.master": wanted,
            "spark.app.name": "eventing-windows",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
            # Adaptive execution re-plans a job at every stage: for the small merge jobs of closed windows
            # that doubles their cost (~0.15 s of JVM time a job) and has nothing to fix. (Streaming
            # queries never use it.)
            "spark.sql.adaptive.enabled": "false",
            # 1M-row batches overflow the default 1 GB heap in Arrow conversions; 2 GB leaves room.
            "spark.driver.memory": "2g",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_log4j2_config(log_level)}",
        }
        _launch_quiet_gateway(settings)
        builder = SparkSession.builder
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel(log_level)
        _session, _master = session, wanted
        return session


# Session settings a Spark Connect client may set (the rest belong to the server's own launch).
_CONNECT_SETTINGS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
    "spark.sql.adaptive.enabled": "false",
}


def _connect(url: str) -> SparkSession:
    """A Spark Connect session on ``url`` (``sc://host:port``): no JVM in this process; the server runs
    the jobs (its executors need not see the data directory: partials go to it as Arrow)."""
    from eventing.errors import ConfigError

    try:
        import grpc  # noqa: F401 - what pyspark's connect client needs, checked up front for one clear line
        import pandas  # noqa: F401
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.session import SparkSession as _ConnectSession  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"--spark-master {url} needs Spark Connect's client packages (missing: {exc.name}); install them "
            "with `pip install 'eventing[spark-connect]'` (or `pip install 'pyspark[connect]'`)"
        ) from None
    builder = SparkSession.builder.remote(url)
    for key, value in _CONNECT_SETTINGS.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server is the same user mistake
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot open a Spark Connect session at {url} ({first}); check the server and --spark-master"
        ) from None


# Printed by the JVM itself on every start (Spark's launcher always adds this module); it says nothing a user
# can act on. Everything else the JVM prints on stderr still goes to stderr.
_QUIET_LINES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)


def _launch_quiet_gateway(settings: dict[str, str]) -> None:
    """Start the driver JVM (as SparkContext would, with the same settings) with its stderr read through a
    filter that drops ``_QUIET_LINES``. No-op when a JVM is already up."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    stream = gateway.proc.stderr  # type: ignore[attr-defined]
    threading.Thread(target=_forward_stderr, args=(stream,), name="spark-stderr", daemon=True).start()
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm


def _forward_stderr(stream) -> None:  # type: ignore[no-untyped-def]
    target = getattr(sys.stderr, "buffer", None)
    for line in iter(stream.readline, b""):
        if line.rstrip().startswith(_QUIET_LINES):
            continue
        try:
            if target is not None:
                target.write(line)
                target.flush()
            else:
                sys.stderr.write(line.decode("utf-8", "replace"))
        except (OSError, ValueError):  # stderr closed at exit
            return


def stop_spark() -> None:
    """Stop this process's SparkSession if one is running; the next ``get_spark()`` starts a new one."""
    global _session, _master
    with _lock:
        if _session is not None:
            _session.stop()
        _session, _master = None, None
