"""`ddtreectl logs` on a `transport: local` host with a service profile, through the real journalctl.

A journalctl that fails (a --since it cannot parse, no journal access) used to print nothing and exit
0, its message thrown away: the operator saw "no log lines" when the truth was "the question was not
answered". It is now exit 5 with journalctl's own words; a negative --lines is a usage error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddtreectl.cli.main import run

pytestmark = pytest.mark.skipif(shutil.which("journalctl") is None, reason="needs journalctl (apt-get install systemd)")


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "services:\n  svc:\n    template: sglang-ddtree.service.j2\n    port: 30000\n"
        "    model_path: /models/x\n    served_model_name: x\n    unit_name: ddtree-qa-logs-test\n"
        f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    service: svc\n    remote_root: {tmp_path / 'root'}\n")
    return path


def test_a_failing_journalctl_is_reported(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "logs", "box", "--since", "not-a-time"]) == 5
    err = capsys.readouterr().err
    assert "box" in err and "journalctl" in err and "not-a-time" in err  # journalctl's own message
    assert "hint:" in err


def test_a_unit_without_entries_is_fine(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "logs", "box", "-n", "5"]) == 0


def test_negative_lines_is_a_usage_error(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "logs", "box", "-n", "-1"]) == 2


def test_logs_all_skips_a_host_without_a_service(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fleet-wide `logs all` reports per host: one that runs no service is skipped and said so, not a
    failure of the run (it exited 6). Named, it is an error (3); with no service anywhere, 3 too."""
    inv.write_text(inv.read_text() + f"  bare:\n    transport: local\n    gpus: 0\n    remote_root: {inv.parent}/r2\n")
    assert run(["-i", str(inv), "logs", "all", "-n", "5"]) == 0
    assert capsys.readouterr().err == "bare: skipped: runs no service profile, no journal to show\n"
    assert run(["-i", str(inv), "logs", "bare", "box", "-n", "5"]) == 6
    assert "error: bare: runs no service profile" in capsys.readouterr().err
    inv.write_text(inv.read_text().replace("    service: svc\n", ""))
    assert run(["-i", str(inv), "logs", "all"]) == 3
    assert "error: no targeted host (box, bare) runs a service profile" in capsys.readouterr().err
