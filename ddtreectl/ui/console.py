"""Shared Rich consoles: results to stdout, progress and diagnostics to stderr (so `--json` stays clean)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@lru_cache(maxsize=None)
def stdout() -> "Console":
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@lru_cache(maxsize=None)
def stderr() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)
