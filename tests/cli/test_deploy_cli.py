"""`ddtreectl deploy|rollback|lock` argument handling (no host is contacted in these cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.main import run

INVENTORY = ("hosts:\n  a: {address: 10.255.255.1}\n  b: {address: 10.255.255.2}\n"
             "groups:\n  pair: [a, b]\n")


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    return path


def test_deploy_needs_an_explicit_target(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "deploy"]) == 2
    err = capsys.readouterr().err
    assert "name what to deploy" in err and "hosts: a, b" in err


def test_unknown_targets_are_inventory_errors(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "deploy", "--host", "nosuch"]) == 3
    assert "'nosuch' is neither a host nor a group" in capsys.readouterr().err
    assert run(["-i", str(inv), "deploy", "--group", "nosuch"]) == 2
    assert "no group named 'nosuch'" in capsys.readouterr().err
    assert run(["-i", str(inv), "rollback"]) == 2
    err = capsys.readouterr().err  # targets as for deploy: positional, --host or --group
    assert "name what to roll back" in err and "`all`" in err and "deploy" not in err
    assert run(["-i", str(inv), "rollback", "nosuch"]) == 3
    assert "'nosuch' is neither a host nor a group" in capsys.readouterr().err


def test_engine_dir_must_be_an_engine(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["-i", str(inv), "deploy", "a", "--engine", str(tmp_path)]) == 2
    assert "not an engine source tree" in capsys.readouterr().err
