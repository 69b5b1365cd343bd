"""Deployable example functions: each is a handler module plus a JSON definition beside it."""

from pathlib import Path

FUNCTIONS_DIR = Path(__file__).parent
