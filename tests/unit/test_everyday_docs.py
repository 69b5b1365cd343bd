"""The examples of docs/everyday-commands.md run as written, top to bottom, on a fresh data directory."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from eventing.cli import main
from eventing.storage.factory import open_bucket

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "everyday-commands.md"


def doc_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert all(line.startswith("eventing ") for line in lines), "the examples are plain eventing commands"
    return [shlex.split(line)[1:] for line in lines]


def test_every_example_of_the_everyday_commands_doc_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "functions").symlink_to(ROOT / "functions")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVENTING_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("EVENTING_METADATA_URL", raising=False)
    outputs = {}
    emails_before_rewind = None
    for argv in doc_commands():
        if argv[0] == "rewind" and emails_before_rewind is None:
            emails_before_rewind = open_bucket(tmp_path / "data", "emails").stats()["mutations"]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"`eventing {shlex.join(argv)}` exited {code}: {err}"
        outputs[shlex.join(argv)] = out
    assert outputs["bucket count customers"].strip().isdigit()
    # Scopes and collections: fn_orders wrote the totals of the priced orders, and the flush's deletes removed
    # them.
    assert outputs["bucket keys shop.sales.totals"].split() == ["order::1", "order::3", "order::4"]
    assert outputs["bucket count shop.sales.totals"].strip() == "0"
    # The rerun after the first rewind (effects kept) wrote nothing to the binding bucket.
    assert re.search(rf"mutations: {emails_before_rewind}\n", outputs["bucket info emails"])
    assert "effects: kept." in outputs["rewind fn_email --to-seqno 0"]
    assert (
        "effects: REAPPLIED." in outputs["rewind fn_email --to-time 2020-01-01T00:00:00Z --reapply-effects"]
    )
