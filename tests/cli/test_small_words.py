"""Small things two QA passes saw: `mode HOST devv` got no "did you mean"; `validate` passed an
identity_file that does not exist on this machine (it showed up at connect time as "login failed");
`logs HOST` on a unit that never ran printed journalctl's bare "-- No entries --"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddtreectl.cli.main import run


def test_a_mistyped_mode_gets_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    remote_root: {tmp_path / 'root'}\n")
    assert run(["-i", str(inv), "mode", "box", "devv"]) == 2
    err = capsys.readouterr().err
    assert "unknown mode 'devv' (did you mean 'dev'?)" in err and "hint: ddtreectl mode box [dev|prod]" in err, err
    assert run(["-i", str(inv), "mode", "box", "xyz"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no guess


def test_validate_warns_about_an_identity_file_this_machine_lacks(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "id_ed25519"
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"defaults:\n  identity_file: {key}\nhosts:\n  a:\n    address: 127.0.0.1\n"
                   f"  b:\n    address: 127.0.0.1\n    identity_file: {tmp_path}\n"
                   f"  c:\n    transport: local\n    remote_root: {tmp_path / 'root'}\n")
    assert run(["-i", str(inv), "validate"]) == 0  # a warning about this machine, not a bad file
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"warning: {inv}:2: identity_file of host a: {key} does not exist on this machine",
        f"hint: create it (ssh-keygen -t ed25519 -f {key}) or point identity_file at your private key; "
        "connecting fails until then",
        f"warning: {inv}:8: identity_file of host b: {tmp_path} is not a file",
        "hint: point identity_file at your private key; connecting fails until then"], err  # c: local, no key
    assert out.endswith("valid (3 hosts, 0 groups, 0 service profiles); 2 identity file warnings above\n"), out
    key.write_text("not checked for content: existence and readability only\n")
    inv.write_text(inv.read_text().replace(f"    identity_file: {tmp_path}\n", ""))
    assert run(["-i", str(inv), "validate"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "warning" not in out, (out, err)
    # Other commands do not repeat it: a connect says so itself, for the host it concerns.
    key.unlink()
    assert run(["-i", str(inv), "lock", "status", "c"]) == 0
    assert "identity_file" not in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="needs journalctl (apt-get install systemd)")
def test_logs_of_a_unit_with_no_entries_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "services:\n  svc:\n    template: sglang-ddtree.service.j2\n    port: 30000\n"
        "    model_path: /models/x\n    served_model_name: x\n    unit_name: ddtree-qa3-never-started\n"
        f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    service: svc\n    remote_root: {tmp_path / 'root'}\n")
    assert run(["-i", str(inv), "logs", "box", "-n", "5"]) == 0
    out = capsys.readouterr().out
    assert out == ("no journal entries for ddtree-qa3-never-started.service yet (not started since boot, "
                   "or no journal is kept)\n"), out
    assert run(["-i", str(inv), "logs", "box", "--since", "1 hour ago"]) == 0
    out = capsys.readouterr().out
    assert out == "no journal entries for ddtree-qa3-never-started.service since '1 hour ago'\n", out
