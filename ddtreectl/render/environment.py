"""The Jinja environment shared by every template: StrictUndefined, unit-file filters, no autoescape."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ddtreectl.render.quoting import exec_line, systemd_escape_specifiers, systemd_quote

if TYPE_CHECKING:
    import jinja2


@lru_cache(maxsize=8)
def make_environment(templates_dir: Path) -> "jinja2.Environment":
    """A Jinja environment loading from `templates_dir` that fails on any undefined variable.

    Cached per directory: a fan-out renders the same templates for every host, and Jinja caches
    compiled templates per environment (it re-checks the file's mtime, so edits are still seen)."""
    import jinja2  # lazy: keep `ddtreectl --help` fast

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["systemd_quote"] = systemd_quote
    env.filters["systemd_escape"] = systemd_escape_specifiers
    env.filters["exec_line"] = exec_line
    return env
