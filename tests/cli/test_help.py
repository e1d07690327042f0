"""Every command's --help states its exit codes (README: "each command's `--help` explains its options
and exit codes"); logs, render, trust, rollback and lock did not."""

from __future__ import annotations

import pytest

from ddtreectl.cli.main import run

COMMANDS = [["status"], ["logs"], ["render"], ["restore-service"], ["trust"], ["set-ip"], ["gpus"], ["mode"],
            ["run"], ["deploy"], ["rollback"], ["lock", "status"], ["lock", "release"], ["validate"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_states_exit_codes(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Exit codes:" in out or "Exit codes" in " ".join(out.split())
    assert "Traceback" not in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`ddtreectl --version` was "No such option: --version" (exit 2)."""
    from importlib.metadata import version

    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"ddtreectl {version('ddtreectl')}\n"
    assert run(["--help"]) == 0 and "--version" in capsys.readouterr().out
