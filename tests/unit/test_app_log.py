"""The application log: log() lines in <data-dir>/logs/<function>.log, rotated by size, and `eventing log`."""

from __future__ import annotations

import json
import threading
import time

from eventing.cli.app import main
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.execution.app_log import AppLogWriter, follow, log_path, tail
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor

HANDLER = """
from eventing.handler import log

def on_update(doc, meta):
    log("handled", meta.id, doc["n"])
"""


def test_log_lines_reach_the_function_log_file_and_the_cli_shows_the_last_ones(data_dir, capsys):
    source = LocalBucket.create(data_dir, "src")
    for i in range(30):
        source.upsert(f"k{i:02d}", {"n": i})
    defn = FunctionDefinition.from_dict(
        {"name": "fn_log", "source_bucket": "src", "app_log_max_size": 600, "app_log_max_files": 3}
    )
    deploy_function(data_dir, defn, HANDLER)
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    path = log_path(data_dir, "fn_log")
    files = sorted(p.name for p in path.parent.glob("fn_log.log*") if not p.name.endswith(".lock"))
    assert files == ["fn_log.log", "fn_log.log.1", "fn_log.log.2"]  # rotated, at most 3 files kept
    assert all(p.stat().st_size <= 600 for p in path.parent.glob("fn_log.log*"))
    last = tail(path, 3)
    # <time> [INFO] <function> <vb>:<seqno> <key> <text>
    assert len(last) == 3 and all(
        line.split(" ", 5)[1:3] == ["[INFO]", "fn_log"] and " handled k" in line for line in last
    )
    assert main(["log", "fn_log", "--lines", "2", "--data-dir", data_dir]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == last[-2:]
    assert main(["log", "fn_log", "--lines", "1", "--json", "--data-dir", data_dir]) == 0
    assert json.loads(capsys.readouterr().out)["lines"] == last[-1:]
    assert main(["log", "fn_nope", "--data-dir", data_dir]) == 2
    assert "unknown function 'fn_nope'" in capsys.readouterr().err


def test_follow_sees_new_lines_across_a_rotation(tmp_path):
    path = tmp_path / "logs" / "fn.log"
    writer = AppLogWriter(path, max_size=200, max_files=2)
    writer.write("first")
    seen: list[str] = []

    def reader() -> None:  # until the last line written is seen, or 5 s
        for line in follow(path, poll_s=0.02, stop=time.monotonic() + 5):
            seen.append(line)
            if line.endswith(" [INFO] last"):
                break

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.2)
    for i in range(10):
        writer.write(f"line {i}")
        time.sleep(0.02)
    writer.write("last")
    t.join()
    assert [line.split(" [INFO] ")[1] for line in seen] == [f"line {i}" for i in range(10)] + ["last"]
