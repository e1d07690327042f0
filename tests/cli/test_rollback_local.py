"""`ddtreectl rollback` on a `transport: local` host with nothing earlier to roll back to.

With one good release deployed (it is `current`) the hint said "deploy a release first", as if
nothing were deployed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtreectl.cli.main import run


def test_rollback_with_only_the_current_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    remote_root: {root}\n")
    assert run(["-i", str(inventory), "rollback", "--host", "box", "--json"]) == 5
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["hint"] == "no release is deployed: deploy one first", error

    (root / "releases" / "r1").mkdir(parents=True)
    (root / "releases" / "r1" / ".build-stamp").write_text(json.dumps({"id": "r1", "selftest": "skipped: no GPU"}))
    (root / "current").symlink_to("releases/r1")
    assert run(["-i", str(inventory), "rollback", "--host", "box"]) == 5
    err = capsys.readouterr().err
    assert "no earlier release with a good build stamp to roll back to (only r1 is deployed)" in err, err
    assert "deploy a release first" not in err and "nothing to roll back to" in err, err
    assert (root / "current").readlink() == Path("releases/r1")


def test_rollback_takes_targets_like_deploy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ddtreectl rollback box` used to be a usage error ("unexpected extra argument") while
    `ddtreectl deploy box` worked: the two commands an operator runs back to back named hosts differently."""
    root = tmp_path / "root"
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    remote_root: {root}\n"
                         "groups:\n  solo: [box]\n")
    for release in ("r0", "r1"):
        (root / "releases" / release).mkdir(parents=True)
        (root / "releases" / release / ".build-stamp").write_text(
            json.dumps({"id": release, "selftest": "skipped: no GPU"}))
    (root / "current").symlink_to("releases/r1")
    (root / "state").mkdir()
    (root / "state" / "previous-release").write_text("r0\n")

    assert run(["-i", str(inventory), "rollback", "box", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["hosts"]
    assert (entry["host"], entry["release"], entry["previous"]) == ("box", "r0", "r1"), entry
    assert (root / "current").readlink() == Path("releases/r0")
    assert run(["-i", str(inventory), "rollback", "solo", "--to", "r1"]) == 0  # a group
    assert "box: current -> r1 (was r0)" in capsys.readouterr().out
    assert run(["-i", str(inventory), "rollback", "all", "--to", "nosuch"]) == 2  # as --help says
    assert "release nosuch does not exist" in capsys.readouterr().err
    assert (root / "current").readlink() == Path("releases/r1")
