"""The release scripts (finalize, switch, list, prune) run for real through the local transport."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddtreectl.errors import RemoteCommandError
from ddtreectl.inventory.models import Host
from ddtreectl.operations import activate
from ddtreectl.operations.release import stamp_text
from ddtreectl.transport.local import LocalTransport


def stamp(rid: str) -> str:
    return stamp_text(rid, archs="90", selftest="skipped: no GPU", by="t", now="t", ninja_steps=1)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ddtree"


@pytest.fixture
def transport(root: Path) -> LocalTransport:
    return LocalTransport(Host(name="here", address="127.0.0.1", transport="local", remote_root=str(root)))


def stage(root: Path, rid: str, mtime: float) -> None:
    inc = root / "releases" / f".incoming-{rid}"
    inc.mkdir(parents=True)
    (inc / "CMakeLists.txt").write_text(rid)


def test_finalize_switch_list_prune(root: Path, transport: LocalTransport) -> None:
    for i, rid in enumerate(["r1", "r2", "r3", "r4", "r5"]):
        stage(root, rid, i)
        activate.finalize(transport, str(root), rid, stamp(rid))
        os.utime(root / "releases" / rid, (1000 + i, 1000 + i))
        assert not (root / "releases" / f".incoming-{rid}").exists()
    assert activate.switch_current(transport, str(root), "r1") is None  # no previous current
    assert os.readlink(root / "current") == "releases/r1"
    assert activate.switch_current(transport, str(root), "r2") == "r1"
    assert activate.switch_current(transport, str(root), "r2") is None  # already current: no change
    listing = activate.list_releases(transport, str(root))
    assert (listing.current, listing.previous) == ("r2", "r1")
    assert all(listing.good(r) for r in ["r1", "r2", "r3", "r4", "r5"])
    stage(root, "failed", 0)  # a failed build's staging dir: removed by the next prune
    # keep 2: the newest two (r5, r4) plus current (r2) and previous (r1); r3 goes.
    assert activate.prune(transport, str(root), 2, ()) == ["r3"]
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["r1", "r2", "r4", "r5"]


def test_switch_refuses_an_unstamped_release(root: Path, transport: LocalTransport) -> None:
    (root / "releases/half").mkdir(parents=True)
    with pytest.raises(RemoteCommandError, match="no build stamp"):
        activate.switch_current(transport, str(root), "half")
    assert not (root / "current").exists()
