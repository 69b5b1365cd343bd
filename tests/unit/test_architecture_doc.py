"""docs/architecture.md is the one place the architecture is written down, and it stays true to the tree.

- No file cites a design document outside the repository by section number: comments and docs point at a
  section of a page under docs/ (or say the reason where they stand).
- Every module and file docs/architecture.md names exists (resolved from the source files, nothing is
  imported), and its layer table lists every layer `tests/unit/test_import_layers.py` enforces.
- A pointer of the form docs/architecture.md, '<Section>' (on one line) names a heading of the page.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# The external document was cited as the capitalised word followed by a section sign, a section number
# or its file suffix ("<word> §3.3", "<word> 3.6", "<word>.md"), or as "see <word>".
EXTERNAL_CITATION = re.compile(r"\bDESIGN(?:\s*§|\s+\d+(?:\.\d+)*\b|\.md\b)|\bsee DESIGN\b")
SKIPPED_DIRS = {
    ".git",
    ".venv",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".eventing",
    "__pycache__",
    "node_modules",
}
MAX_TEXT_BYTES = 2_000_000

MODULE = re.compile(r"\b((?:eventing|metadata|sharding)(?:\.\w+)+)")
FILE = re.compile(r"\b((?:eventing|metadata|sharding|scripts|tests|functions|examples|docs)/[\w./-]*[\w/])")
# "docs/architecture.md, 'Exactly once'" in code; "[architecture.md](architecture.md), 'Exactly once'" in
# docs.
POINTER = re.compile(r"(?:docs/|\]\()(architecture\.md)\)?,[ \t]*'([^'\n]+)'")


def text_files() -> Iterator[Path]:
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if (
                    entry.name not in SKIPPED_DIRS
                    and not entry.name.endswith(".egg-info")
                    and not entry.is_symlink()
                ):
                    stack.append(entry)
            elif entry.is_file() and entry.stat().st_size <= MAX_TEXT_BYTES:
                yield entry


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:4096]:
        return None  # a binary file (a bucket, a Parquet file)
    return data.decode("utf-8", errors="replace")


def citations(text: str) -> list[str]:
    return [m.group(0) for m in EXTERNAL_CITATION.finditer(text)]


def test_no_file_cites_an_external_design_document():
    found = []
    for path in text_files():
        text = read_text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for cite in citations(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {cite!r}")
    assert found == [], "point at a section of docs/architecture.md instead: " + "; ".join(found)


def test_the_citation_check_sees_each_old_form():
    word = "DES" + "IGN"  # spelled apart so this file does not cite it
    for cited in (
        f"the handoff rule ({word} §3.3)",
        f"agree ({word} 3.6).",
        f"({word} 3.1, 3.2)",
        f"see {word}.md",
        f"see {word}",
    ):
        assert citations(cited), cited
    assert citations("see docs/architecture.md, 'Exactly once'") == []
    assert citations(f"{word}ED for speed") == []


def module_file(parts: list[str]) -> tuple[Path, int] | None:
    """The source file of the longest module prefix of `parts`, and how many parts it covers."""
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, cut
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names[sub.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):
            names.update(defined_names(node.body))
    return names


def resolves(dotted: str) -> bool:
    """True when `dotted` is a module of the tree, or a name defined in one (a class's own names too)."""
    parts = dotted.split(".")
    found = module_file(parts)
    if found is None:
        return False
    path, cut = found
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for name in parts[cut:]:
        node = defined_names(body).get(name)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def test_every_module_and_file_the_architecture_page_names_exists():
    text = ARCHITECTURE.read_text()
    modules = set(MODULE.findall(text))
    files = set(FILE.findall(text))
    assert len(modules) >= 10 and len(files) >= 20, "the page names the modules that implement each part"
    missing = sorted({m for m in modules if not resolves(m)} | {f for f in files if not (ROOT / f).exists()})
    assert missing == [], "docs/architecture.md names what the tree does not have: " + ", ".join(missing)


def test_the_name_check_tells_a_stale_name():
    assert resolves("eventing.workers.worker.WorkerCore.commit")
    assert resolves("eventing.windows.batches.write_row_spool")
    assert not resolves("eventing.windows.runtime.rows")  # a module the window runtime never had
    assert not resolves("eventing.workers.worker.WorkerCore.no_such_method")


def enforced_layers() -> list[tuple[str, ...]]:
    tree = ast.parse((ROOT / "tests" / "unit" / "test_import_layers.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "LAYERS"
        ):
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError("tests/unit/test_import_layers.py has no LAYERS")


def test_the_layer_table_lists_every_enforced_layer_in_order():
    text = ARCHITECTURE.read_text()
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\s+(\d+)\s{2,}(\S.*)$", line)
        if match:
            rows[int(match.group(1))] = match.group(2)
    layers = enforced_layers()
    for number, modules in enumerate(layers, 1):
        assert number in rows, f"the layer table has no row {number} for {modules}"
        listed = set(re.findall(r"(?:eventing|metadata|sharding)[\w.]*", rows[number]))
        assert set(modules) <= listed, f"layer {number} lists {sorted(listed)}, the check enforces {modules}"
    assert max(rows) == len(layers)


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if re.match(r"^#{1,6} ", line)}


def test_every_pointer_to_an_architecture_section_names_one_of_its_headings():
    bad = []
    pointers = 0
    for path in text_files():
        if path.suffix not in (".py", ".md") or path in (ARCHITECTURE, Path(__file__).resolve()):
            continue
        text = read_text(path) or ""
        for page, section in POINTER.findall(text):
            pointers += 1
            target = ROOT / "docs" / page
            if not target.is_file() or section not in headings(target):
                bad.append(f"{path.relative_to(ROOT)}: docs/{page}, '{section}'")
    assert pointers >= 3, "code and docs point at sections of docs/architecture.md"
    assert bad == [], "pointers to sections that do not exist: " + "; ".join(bad)


def test_the_pointer_check_reads_both_forms():
    assert POINTER.findall("see docs/architecture.md, 'Exactly once'") == [
        ("architecture.md", "Exactly once")
    ]
    assert POINTER.findall("([architecture.md](architecture.md), 'Timers')") == [
        ("architecture.md", "Timers")
    ]
    assert {"Exactly once", "Timers"} <= headings(ARCHITECTURE)
    assert "No such section" not in headings(ARCHITECTURE)
