"""What every ddtreectl start pays: importing the CLI registers every command, so nothing heavy may
load at that point (shared/design.md: paramiko/jinja2 lazily; `ddtreectl --help` stays fast).
Checked in a fresh interpreter, by module name, not by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "invoke", "fabric", "jinja2", "yaml", "rich", "pygments", "markdown_it",
         "typer.rich_utils", "ddtreectl.operations", "ddtreectl.transport.ssh", "ddtreectl.render",
         "ddtreectl.ui.status_table", "ddtreectl.fleet")


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_importing_the_cli_loads_nothing_heavy() -> None:
    assert heavy(loaded_after("import ddtreectl.cli.main")) == []


def test_help_is_rendered_without_rich() -> None:
    code = ("import contextlib, io\nfrom ddtreectl.cli.main import run\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    run(['--help']); run(['status', '--help'])")
    assert heavy(loaded_after(code)) == []


def test_reused_status_transport_needs_no_paramiko() -> None:
    # The OpenSSH path (status with reuse) must not pull Paramiko in just by being importable.
    modules = loaded_after("import ddtreectl.transport.mux, ddtreectl.operations.status")
    assert not {"paramiko", "ddtreectl.transport.ssh", "jinja2"} & modules
