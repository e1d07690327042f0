"""Find and load libddtree with ctypes, and turn its status codes into Python exceptions.

Search order: $DDTREE_LIB (a file), then the newest engine/build*/libddtree.so of this checkout, then
the copy packaged next to this module (ddtree_engine/lib/libddtree.so). The library is loaded once per
process; each device is checked once for a kernel image of its architecture, so a library built for
sm_90 fails on an sm_120 card with a message that says how to rebuild, instead of a cryptic launch error.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Sequence

_ENGINE_DIR = Path(__file__).resolve().parents[2]  # engine/
_PACKAGED = Path(__file__).resolve().parent / "lib" / "libddtree.so"

# Status codes (include/ddtree/status.h).
SUCCESS = 0
INVALID_ARGUMENT = 1
CUDA_ERROR = 2
NO_KERNEL_IMAGE = 3
WORKSPACE_TOO_SMALL = 4
UNSUPPORTED = 5
INTERNAL = 6

# Device-side error flag bits.
FLAG_NAN_INPUT = 0x1
FLAG_BAD_INDEX = 0x2

# ddtree_dtype_t.
DTYPE_FLOAT32 = 0
DTYPE_BFLOAT16 = 1
DTYPE_FLOAT16 = 2


class DdtreeError(RuntimeError):
    """A libddtree call failed; `status` is the ddtree_status_t code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DdtreeLibraryError(DdtreeError):
    """libddtree is missing, unloadable, or holds no code for this GPU."""


class DdtreeDeviceError(DdtreeError):
    """A kernel raised a device-side error flag (NaN input, out-of-range index)."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None
_checked_devices: set[int] = set()
_functions: dict[str, Any] = {}


def candidate_paths() -> list[Path]:
    """Where load() looks, in order."""
    env = os.environ.get("DDTREE_LIB")
    if env:
        return [Path(env)]
    builds = sorted(_ENGINE_DIR.glob("build*/libddtree.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [*builds, _PACKAGED]


def load() -> ctypes.CDLL:
    """Load libddtree once; raise DdtreeLibraryError naming every place tried when it is missing."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = candidate_paths()
        for path in tried:
            if not path.is_file():
                continue
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise DdtreeLibraryError(NO_KERNEL_IMAGE, f"cannot load {path}: {exc}") from exc
            lib.ddtree_last_error.restype = ctypes.c_char_p
            lib.ddtree_last_error.argtypes = []
            lib.ddtree_status_string.restype = ctypes.c_char_p
            lib.ddtree_status_string.argtypes = [ctypes.c_int]
            lib.ddtree_build_info.restype = ctypes.c_char_p
            lib.ddtree_build_info.argtypes = []
            lib.ddtree_check_device.restype = ctypes.c_int
            lib.ddtree_check_device.argtypes = []
            _lib, _lib_path = lib, path
            return lib
        where = ", ".join(str(p) for p in tried)
        raise DdtreeLibraryError(
            NO_KERNEL_IMAGE,
            f"libddtree.so not found (looked at: {where}); build it with "
            "`cmake -S engine -B engine/build -G Ninja && cmake --build engine/build` or set DDTREE_LIB",
        )


def library_path() -> Path:
    """Path of the loaded library (loads it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path


def build_info() -> str:
    """Version and compiled architectures, e.g. 'ddtree 0.1 archs=90,120'."""
    return str(load().ddtree_build_info().decode())


def last_error() -> str:
    return str(load().ddtree_last_error().decode(errors="replace"))


def check(status: int, what: str) -> None:
    """Raise DdtreeError for a non-success status, with the library's message."""
    if status == SUCCESS:
        return
    lib = load()
    name = lib.ddtree_status_string(status).decode()
    cls = DdtreeLibraryError if status == NO_KERNEL_IMAGE else DdtreeError
    raise cls(status, f"{what} failed: {name}: {last_error()}")


def ensure_device(device_index: int) -> None:
    """Check once per device that the library holds code for it (the caller made it current)."""
    if device_index in _checked_devices:
        return
    lib = load()
    check(lib.ddtree_check_device(), f"libddtree ({_lib_path}) on cuda:{device_index}")
    _checked_devices.add(device_index)


def function(name: str, argtypes: Sequence[Any], restype: Any = ctypes.c_int) -> Any:
    """A typed handle to one C function of the library (cached)."""
    fn = _functions.get(name)
    if fn is None:
        fn = getattr(load(), name)
        fn.argtypes = list(argtypes)
        fn.restype = restype
        _functions[name] = fn
    return fn
