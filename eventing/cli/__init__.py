"""The `eventing` command: one module per command group, `common` for what they share."""

from eventing.cli.app import main

__all__ = ["main"]
