"""A failed copy onto a host: the host's free space decides the hint, not rsync's message.

rsync can exit 11 with nothing on stderr when its receiver runs out of space (seen in CI on a test
host whose release root was a small tmpfs), so a failed copy asks the host (`df`) instead. These run
the probe through the real local transport on this machine's own disk.
"""

from __future__ import annotations

from pathlib import Path

from ddtreectl.errors import RemoteCommandError
from ddtreectl.inventory.models import Host
from ddtreectl.operations.release import ShippedFile
from ddtreectl.operations.sync import explain_failed_copy, shipped_kib
from ddtreectl.transport.local import LocalTransport


def local(root: Path) -> LocalTransport:
    return LocalTransport(Host(name="here", address="127.0.0.1", transport="local", remote_root=str(root)))


def test_less_free_space_than_a_release_takes_names_the_full_disk(tmp_path: Path) -> None:
    err = RemoteCommandError("rsync failed (exit 11): ", host="here", hint="check free disk space")
    with local(tmp_path) as t:
        got = explain_failed_copy(err, t, str(tmp_path), need_kib=1 << 60)  # more than any disk holds
    assert got is not err
    assert got.message.startswith("rsync failed (exit 11); ") and got.message.endswith(f" KiB free under {tmp_path}")
    assert got.hint is not None and "disk is full" in got.hint and f"df -h {tmp_path}" in got.hint
    assert got.host == "here" and got.exit_code == err.exit_code


def test_enough_free_space_keeps_the_original_error(tmp_path: Path) -> None:
    err = RemoteCommandError("rsync failed (exit 23): some files vanished", host="here", hint="original hint")
    with local(tmp_path) as t:
        assert explain_failed_copy(err, t, str(tmp_path), need_kib=1) is err


def test_a_root_df_cannot_read_keeps_the_original_error(tmp_path: Path) -> None:
    err = RemoteCommandError("rsync failed (exit 11): ", host="here", hint="original hint")
    with local(tmp_path) as t:
        assert explain_failed_copy(err, t, str(tmp_path / "no" / "such" / "dir"), need_kib=1 << 60) is err


def test_shipped_kib_counts_whole_blocks_per_file(tmp_path: Path) -> None:
    engine, templates = tmp_path / "engine", tmp_path / "templates"
    (engine / "src").mkdir(parents=True)
    templates.mkdir()
    (engine / "src" / "a.cu").write_bytes(b"x" * 5000)  # 2 blocks
    (engine / "CMakeLists.txt").write_bytes(b"y")  # 1 block
    (templates / "unit.j2").write_bytes(b"z" * 4096)  # 1 block
    files = tuple(ShippedFile(p, "0" * 64, False) for p in ("src/a.cu", "CMakeLists.txt", "templates/unit.j2"))
    assert shipped_kib(files, engine, templates) == 16
