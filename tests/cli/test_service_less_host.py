"""Commands about a host's service, asked of a host whose inventory entry names no service profile.

Nothing remote failed and nothing crashed: the inventory lacks `service:` for that host, so the exit
code is 3 (inventory; shared/design.md) with the hint to set it. It was 1 ("internal") for `render` and
`logs` and 5 ("remote command failed") for `restore-service`; `restore-service` with no target and no
`role: prod` host was 5 too, where it is a usage error (2) like `deploy` without a target."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.main import run


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    role: dev\n"
                    f"    remote_root: {tmp_path / 'root'}\n")
    return path


@pytest.mark.parametrize("command", [["render", "box"], ["render", "box", "--diff"], ["logs", "box"],
                                     ["restore-service", "box"]])
def test_a_host_without_service_is_an_inventory_error(inv: Path, command: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), *command]) == 3
    err = capsys.readouterr().err
    assert "box" in err and "no service profile" in err
    assert "hint: set hosts.box.service in hosts.yaml" in err


def test_restore_service_without_prod_hosts_is_a_usage_error(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "restore-service"]) == 2
    err = capsys.readouterr().err
    assert "no host with role prod" in err and "hint: name the hosts to restore" in err
