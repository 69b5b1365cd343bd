"""Names users give things: buckets (function names are checked by the definition)."""

from __future__ import annotations

import re

from eventing.errors import ConfigError

# The project's own packages (Ray ships them to other nodes; a sandboxed child may read them alone).
PROJECT_PACKAGES = ("eventing", "metadata", "sharding")

BUCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.%-]{0,99}$")


def check_bucket_name(name: object) -> None:
    if not isinstance(name, str) or not BUCKET_NAME.match(name):
        raise ConfigError(
            f"bucket name {name!r} is not valid; use 1-100 letters, digits, '_', '-', '.' or '%', "
            "starting with a letter or digit"
        )
