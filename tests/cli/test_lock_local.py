"""`ddtreectl lock status|release` on a `transport: local` host (the same shell scripts a remote host runs).

The lock name becomes a path under <remote_root>/state/locks/ and `release` removes that directory
with `rm -rf`: a name like `../../../etc/x` must be refused (usage error) before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.main import run
from tests.cli.local_box import make_gpuless_box


@pytest.fixture
def box(tmp_path: Path) -> tuple[Path, Path]:
    return make_gpuless_box(tmp_path)


@pytest.mark.parametrize("name", ["../../../victim/x", "a/b", "", "-x", "mode lock"])
def test_lock_names_that_leave_the_locks_directory_are_refused(box: tuple[Path, Path], tmp_path: Path, name: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    inventory, root = box
    victim = tmp_path / "victim" / "x.lock"
    victim.mkdir(parents=True)
    (victim / "owner.json").write_text('{"owner": "someone@else", "kind": "manual"}')
    (root / "state" / "locks").mkdir(parents=True)
    for command in (["status"], ["release", "--force"]):
        assert run(["-i", str(inventory), "lock", *command, "box", "--name", name]) == 2
        assert "lock name" in capsys.readouterr().err
    assert (victim / "owner.json").exists()


def test_mode_and_deploy_locks_are_accepted(box: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    inventory, _ = box
    for name in ("deploy", "mode"):
        assert run(["-i", str(inventory), "lock", "status", "box", "--name", name]) == 0
        assert f"{name} lock free" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "suggestion"), [("mdoe", "mode"), ("depoly", "deploy"), ("build", None)])
def test_a_name_ddtreectl_never_locks_is_refused_not_reported_free(
        box: tuple[Path, Path], capsys: pytest.CaptureFixture[str], name: str, suggestion: str | None) -> None:
    """A typo of a lock name used to read as a free lock (exit 0) while the real lock was held."""
    inventory, root = box
    held = root / "state" / "locks" / "mode.lock"
    held.mkdir(parents=True)
    (held / "owner.json").write_text('{"owner": "dave@ops", "reason": "switch", "kind": "auto", "ttl_s": 600}')
    for command in (["status"], ["release", "--force"]):
        assert run(["-i", str(inventory), "lock", *command, "box", "--name", name]) == 2
        err = capsys.readouterr().err
        assert f"'{name}' is not a lock name ddtreectl takes" in err, err
        assert (f"did you mean '{suggestion}'?" in err) if suggestion else ("did you mean" not in err), err
        assert "--name deploy" in err and "--name mode" in err, err
    assert (held / "owner.json").exists()
    assert run(["-i", str(inventory), "lock", "status", "box", "--name", "mode"]) == 8


def test_lock_status_json_free_held_and_refused(box: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Scripts want the holder without parsing the text line: one `ddtreectl.lock-status/1` document,
    free = exit 0, held = exit 8 with error null, a refused name = exit 2 with the error set."""
    import json

    inventory, root = box
    assert run(["-i", str(inventory), "lock", "status", "box", "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert free == {"schema": "ddtreectl.lock-status/1", "exit_code": 0, "ok": True, "error": None, "host": "box",
                    "lock": "deploy", "held": False, "holder": None}

    held = root / "state" / "locks" / "mode.lock"
    held.mkdir(parents=True)
    (held / "owner.json").write_text('{"owner": "dave@ops", "reason": "switch", "kind": "auto", "ttl_s": 600, '
                                     '"since": 1700000000}')
    assert run(["-i", str(inventory), "lock", "status", "box", "--name", "mode", "--json"]) == 8
    doc = json.loads(capsys.readouterr().out)
    assert (doc["exit_code"], doc["ok"], doc["error"], doc["lock"], doc["held"]) == (8, False, None, "mode", True)
    holder = doc["holder"]
    assert (holder["owner"], holder["reason"], holder["kind"], holder["ttl_s"]) == ("dave@ops", "switch", "auto", 600)
    assert (holder["since"], holder["since_utc"], holder["expired"]) == (1700000000, "2023-11-14T22:13:20Z", True)
    assert holder["description"].startswith("held by dave@ops since 2023-11-14 22:13:20 UTC"), holder

    assert run(["-i", str(inventory), "lock", "status", "box", "--name", "mdoe", "--json"]) == 2
    out = capsys.readouterr()
    refused = json.loads(out.out)
    assert (refused["schema"], refused["exit_code"], refused["host"]) == ("ddtreectl.lock-status/1", 2, "box")
    assert "not a lock name" in refused["error"]["message"] and "error:" in out.err
