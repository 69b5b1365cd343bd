"""The documentation runs as written: every ```bash block of README.md and docs/*.md, top to bottom per page,
in a fresh copy of the checkout, with the project's `eventing` and `python` on the path, must exit 0.

A block preceded by `<!-- not-run: REASON -->` is skipped (it needs a Couchbase cluster, is interactive, or is
a long benchmark). Each page starts from a fresh clone because a reader follows one page at a time; blocks of
a page share its directory, as a reader's shell would. The module and file paths the pages name must exist.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>[^>]*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
BLOCK_TIMEOUT_S = 300
# Left out of the copy: a checkout's own state and caches, not part of a fresh clone.
NOT_COPIED = (
    ".git",
    ".venv",
    ".eventing",
    "__pycache__",
    "*.egg-info",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "rebalance-sim",
    "out",
    "backups",
)
# Settings of the caller's shell that would point the examples at another deployment.
CLEARED_ENV = (
    "EVENTING_DATA_DIR",
    "EVENTING_STORE",
    "EVENTING_METADATA_URL",
    "EVENTING_RAY_ADDRESS",
    "EVENTING_SPARK_MASTER",
    "EVENTING_COUCHBASE_USERNAME",
    "EVENTING_COUCHBASE_PASSWORD",
    "VIRTUAL_ENV",
    # the suite runs its own functions unconfined (tests/conftest.py); the docs run as a user runs them:
    # sandboxed by default where the machine can sandbox
    "EVENTING_DEFAULT_ISOLATION",
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason, when the block is marked not-run


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match.group(1)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.search(previous)
        out.append(
            Block(
                page.relative_to(ROOT).as_posix(),
                start + 1,
                language,
                "\n".join(body) + "\n",
                marker.group("reason") if marker else None,
            )
        )
    return out


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks_of(page) if b.language == "bash" and b.not_run is None]


def fresh_clone(dest: Path) -> Path:
    clone = dest / "clone"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(*NOT_COPIED), symlinks=True)
    # `.venv/bin/...` and `source .venv/bin/activate` in the docs mean the venv running this test.
    (clone / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return clone


def shell_env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The checkout under test comes first, ahead of whatever the venv has installed.
    env["PYTHONPATH"] = str(clone)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env["MPLBACKEND"] = "Agg"
    return env


# `eventing` is the checkout's, whatever console script the venv holds; errors stop the block as they would
# stop a reader.
PRELUDE = 'set -eo pipefail\neventing() { python -m eventing "$@"; }\n'


def run_block(block: Block, clone: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A session of its own, so a timeout ends this block's processes (and only them).
    proc = subprocess.Popen(
        ["bash", "-c", PRELUDE + block.text],
        cwd=clone,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"{block.page}:{block.line} did not finish within "
            f"{BLOCK_TIMEOUT_S}s\n{out[-3000:]}\n{err[-3000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_runnable_block_of_the_page_exits_0(page: Path, tmp_path: Path) -> None:
    blocks = runnable(page)
    if not blocks:
        pytest.skip(f"{page.name} has no runnable shell block")
    clone = fresh_clone(tmp_path)
    env = shell_env(clone)
    try:
        for block in blocks:
            result = run_block(block, clone, env)
            assert result.returncode == 0, (
                f"{block.page}:{block.line} exited {result.returncode}\n--- block\n{block.text}"
                f"--- stdout (tail)\n{result.stdout[-3000:]}\n--- stderr (tail)\n{result.stderr[-3000:]}"
            )
    finally:
        stop_servers_under(clone)


def stop_servers_under(folder: Path) -> None:
    """Throwaway PostgreSQL servers a page started from its folder (docs/postgresql.md) end with it, by their
    data directory, even when a block failed before the page's own stop."""
    from eventing.testing.postgres import HANDLE_FILE
    from eventing.testing.postgres import main as throwaway

    for handle in folder.rglob(HANDLE_FILE):
        throwaway(["stop", "--folder", str(handle.parent)])


HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


def _without_heredocs(text: str) -> str:
    """A block's commands: the bodies of its here-documents (files it writes: a handler's Python) left out."""
    kept, end = [], None
    for line in text.splitlines():
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        kept.append(line)
        opened = HEREDOC.search(line)
        end = opened.group(1) if opened else None
    return "\n".join(kept)


def test_every_shell_block_runs_or_says_why_not() -> None:
    for page in PAGES:
        for block in blocks_of(page):
            if block.language in ("sh", "shell", "console"):
                pytest.fail(f"{block.page}:{block.line}: mark shell blocks ```bash so they are run or marked")
            commands = _without_heredocs(block.text)
            if (
                block.language == "bash"
                and block.not_run is None
                and re.search(r"&&|^\s*(if|for|while)\b", commands, re.M)
            ):
                pytest.fail(
                    f"{block.page}:{block.line}: one command per line in a runnable block; `a && b` or a "
                    "compound command would hide a's failure from this check (set -e)"
                )
            if block.not_run is not None:
                assert block.not_run, f"{block.page}:{block.line}: a not-run marker needs a reason"
                assert block.language == "bash", f"{block.page}:{block.line}: not-run marks only bash blocks"


def test_the_readme_links_every_docs_page_and_every_link_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), (
                f"{page.relative_to(ROOT)} links {target}, which does not exist"
            )


MODULE_PATH = re.compile(r"`((?:eventing|metadata|sharding)(?:\.\w+)+)`")
FILE_PATH = re.compile(r"`((?:eventing|metadata|sharding|scripts|tests|functions|examples|docs)/[\w./-]*\w)`")


def test_every_module_and_file_the_pages_name_exists() -> None:
    missing = []
    for page in PAGES:
        text = page.read_text()
        for dotted in MODULE_PATH.findall(text):
            if not resolves(dotted):
                missing.append(f"{page.name}: {dotted}")
        for path in FILE_PATH.findall(text):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, "the docs name what the code does not have: " + ", ".join(missing)


def resolves(dotted: str) -> bool:
    """True when `dotted` is a module, or an attribute reached from its longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False
