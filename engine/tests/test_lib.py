"""The ctypes loader: where it looks, and the errors it raises when libddtree is missing or unloadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_engine import _lib


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_lib_path", None)
    monkeypatch.setattr(_lib, "_functions", {})
    monkeypatch.setattr(_lib, "_checked_devices", set())


def test_env_path_is_the_only_candidate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DDTREE_LIB", str(tmp_path / "x.so"))
    assert _lib.candidate_paths() == [tmp_path / "x.so"]
    monkeypatch.delenv("DDTREE_LIB")
    paths = _lib.candidate_paths()
    assert paths[-1].name == "libddtree.so" and paths[-1].parent.name == "lib"


def test_missing_library_names_every_place_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 fresh_loader: None) -> None:
    monkeypatch.setenv("DDTREE_LIB", str(tmp_path / "nowhere" / "libddtree.so"))
    with pytest.raises(_lib.DdtreeLibraryError, match="not found.*nowhere.*cmake -S engine"):
        _lib.load()


def test_unloadable_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_loader: None) -> None:
    bogus = tmp_path / "libddtree.so"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setenv("DDTREE_LIB", str(bogus))
    with pytest.raises(_lib.DdtreeLibraryError, match="cannot load"):
        _lib.load()


def test_check_passes_success_and_raises_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    _lib.check(_lib.SUCCESS, "noop")

    class FakeLib:
        @staticmethod
        def ddtree_status_string(status: int) -> bytes:
            return b"DDTREE_STATUS_INVALID_ARGUMENT"

        @staticmethod
        def ddtree_last_error() -> bytes:
            return b"k must be in [1, 1024], got 0"

    monkeypatch.setattr(_lib, "load", lambda: FakeLib())
    with pytest.raises(_lib.DdtreeError, match="op failed: DDTREE_STATUS_INVALID_ARGUMENT: k must be") as info:
        _lib.check(_lib.INVALID_ARGUMENT, "op")
    assert info.value.status == _lib.INVALID_ARGUMENT
    with pytest.raises(_lib.DdtreeLibraryError):
        _lib.check(_lib.NO_KERNEL_IMAGE, "op")
