"""Where the inventory came from is named when it cannot be read: a missing file set through
$DDTREECTL_INVENTORY used to get the hint "... or set DDTREECTL_INVENTORY", which it already was."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.app import OPTIONS
from ddtreectl.cli.main import run


@pytest.fixture(autouse=True)
def _reset_options() -> object:
    yield
    OPTIONS.inventory = None


def test_missing_inventory_from_the_environment_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    monkeypatch.setenv("DDTREECTL_INVENTORY", str(missing))
    assert run(["render", "box"]) == 3
    err = capsys.readouterr().err
    assert f"{missing}: inventory file not found (from $DDTREECTL_INVENTORY)" in err
    assert "unset DDTREECTL_INVENTORY" in err


def test_missing_inventory_from_the_option_keeps_the_plain_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DDTREECTL_INVENTORY", raising=False)
    missing = tmp_path / "nope.yaml"
    assert run(["-i", str(missing), "render", "box"]) == 3
    err = capsys.readouterr().err
    assert f"{missing}: inventory file not found\n" in err and "$DDTREECTL_INVENTORY" not in err
