"""The unit run (`-m "not integration"`) selects no test of this directory: every module here is marked
`integration`. Importing them would still cost each xdist process seconds (schemathesis, Ray clusters'
helpers...), so that run does not collect them at all."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr") == "not integration" and collection_path.suffix == ".py":
        return True
    return None
