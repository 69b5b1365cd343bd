"""Run the fault-injection scenarios and tabulate their figures for the project's notes.

    .venv/bin/python scripts/fault_report.py              # run tests/integration/test_faults.py, print a
                                                          # table
    .venv/bin/python scripts/fault_report.py --soak       # the long (soak) variants as well
    .venv/bin/python scripts/fault_report.py --from DIR   # only tabulate figures an earlier run wrote to DIR
    .venv/bin/python scripts/fault_report.py --markdown   # a Markdown table; --json for the raw figures

Each scenario writes its figures (mutations produced and handled, duplicate handler calls, recovery time,
and what is particular to it) as one JSON file into $EVENTING_FAULT_FIGURES; this script points that at a
fresh directory, runs pytest, then reads them back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eventing.cli.output import table  # noqa: E402

COLUMNS = ("mutations", "handled", "duplicate_handler_calls", "recovery_s")
SKIP = {"scenario", "test", *COLUMNS}


def run_scenarios(folder: Path, soak: bool, pytest_args: list[str]) -> int:
    env = {**os.environ, "EVENTING_FAULT_FIGURES": str(folder)}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    marker = "integration and not soak" if not soak else "integration"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        marker,
        "tests/integration/test_faults.py",
        *pytest_args,
    ]
    print("$ " + " ".join(command), file=sys.stderr)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def read_figures(folder: Path) -> list[dict]:
    figures = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]

    def order(f: dict) -> tuple:
        number = f["scenario"].split()[0]
        return (int(number) if number.isdigit() else 99, f["scenario"], f["test"])

    return sorted(figures, key=order)


def details(figure: dict) -> str:
    parts = []
    for key, value in figure.items():
        if key in SKIP:
            continue
        if isinstance(value, dict):
            value = "/".join(str(v) for v in value.values())
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def render(figures: list[dict], markdown: bool) -> str:
    headers = ["scenario", "mutations", "handled", "dup. calls", "recovery s", "details"]
    rows = [[f["scenario"], *(f.get(c) for c in COLUMNS), details(f)] for f in figures]
    if not markdown:
        return table(headers, rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join("-" if c is None else str(c).replace("|", "/") for c in row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--from", dest="source", metavar="DIR", help="tabulate figures already written to DIR"
    )
    parser.add_argument("--soak", action="store_true", help="also run the soak variants (minutes)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    code = 0
    if args.source:
        folder = Path(args.source)
        if not folder.is_dir():
            print(f"error: no figures directory {folder}; run without --from to produce one", file=sys.stderr)
            return 2
    else:
        folder = Path(tempfile.mkdtemp(prefix="eventing-fault-figures-"))
        code = run_scenarios(folder, args.soak, args.pytest_args)
    figures = read_figures(folder)
    if not figures:
        print(f"error: no figures in {folder}; did the scenarios run?", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(render(figures, args.markdown))
        print(f"\n{len(figures)} scenarios; figures in {folder}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
