"""The commands `eventing demo` suggests next run as printed: `bash scripts/demo.sh` runs
`.venv/bin/eventing`, which is on no PATH, so the hints name it that way (`eventing` where that is the one on
PATH, `python -m eventing` when run so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventing.cli import demo

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def runs_as_printed(command: str, path: str) -> bool:
    done = subprocess.run(
        f"{command} --help",
        shell=True,
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        timeout=60,
    )
    return done.returncode == 0 and b"usage: eventing" in done.stdout


@pytest.mark.skipif(
    not (VENV_BIN / "eventing").exists(), reason="the eventing script is not installed beside python"
)
def test_the_demo_names_the_command_as_it_was_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    bare_path = (
        os.pathsep.join(
            p
            for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != VENV_BIN.resolve()
        )
        or "/usr/bin:/bin"
    )
    monkeypatch.setenv("PATH", bare_path)
    monkeypatch.setattr(sys, "argv", [os.path.relpath(VENV_BIN / "eventing"), "demo"])  # as scripts/demo.sh
    as_demo_sh = demo.program()
    assert as_demo_sh == os.path.relpath(VENV_BIN / "eventing") and as_demo_sh != "eventing"
    assert runs_as_printed(as_demo_sh, bare_path)
    assert not runs_as_printed("eventing", bare_path)  # what the hints said before: command not found

    activated = os.pathsep.join([str(VENV_BIN), bare_path])  # the venv activated: `eventing` is this one
    monkeypatch.setenv("PATH", activated)
    monkeypatch.setattr(sys, "argv", [str(VENV_BIN / "eventing"), "demo"])
    assert demo.program() == "eventing" and runs_as_printed("eventing", activated)

    monkeypatch.setattr(sys, "argv", [str(ROOT / "eventing" / "__main__.py"), "demo"])  # python -m eventing
    as_module = demo.program()
    assert as_module.endswith(" -m eventing") and runs_as_printed(as_module, bare_path)
    assert demo._console_hint(".eventing").startswith(f"{as_module} serve --data-dir .eventing")


def test_the_readme_says_everything_the_demo_does():
    """The README's paragraph on scripts/demo.sh names every bucket and function the demo makes, the chart
    it draws, and the command form its hints print (a reader once learned of fn_email and fn_score only)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("`scripts/demo.sh` creates")
    paragraph = readme[start : readme.index("\n\n", start)]
    for name in (*demo.DEMO_BUCKETS, *demo.DEMO_FUNCTIONS):
        assert f"`{name}`" in paragraph, name
    assert f"`.eventing/{demo.WINDOW_FUNCTION}.png`" in paragraph and "chart" in paragraph
    assert "`.venv/bin/eventing`" in paragraph
