"""Shared Rich consoles: results to stdout, progress and diagnostics to stderr (so `--json` stays clean)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def _console(**options: Any) -> "Console":
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            # Rich's default points fd 1 at /dev/null and raises SystemExit(1): a silent exit 1, and
            # the CLI could no longer tell that its reader left. The BrokenPipeError goes on instead,
            # through every `finally:`, to the CLI boundary (cli/pipes.py), which ends as SIGPIPE.
            raise  # called inside Rich's `except BrokenPipeError:`: re-raises that exception

    return PipeAwareConsole(**options)


@lru_cache(maxsize=None)
def stdout() -> "Console":
    return _console(highlight=False, soft_wrap=True)


@lru_cache(maxsize=None)
def stdout_plain() -> "Console":
    """Rich's default options (soft wrap off): the status table, fitted cell by cell to the width."""
    return _console()


@lru_cache(maxsize=None)
def stderr() -> "Console":
    return _console(stderr=True, highlight=False, soft_wrap=True)
