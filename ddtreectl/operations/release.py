"""What a release is: the shipped file set, its content-hash id, the build stamp, and which old
releases to prune. Pure (local files only, no host): the deploy steps build on these.

A release id is the hash of everything that decides what runs on the host: the engine's sources,
the unit templates, and the build settings (CUDA archs, CMake arguments). Same inputs, same id, on
any machine and in any checkout, so a redeploy of unchanged inputs finds its release already built.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

ID_LENGTH = 12

# What never ships: build outputs, Python caches, test caches. rsync gets the same rules
# (RSYNC_EXCLUDES) so the hashed set and the synced set cannot drift apart.
SKIP_DIRS = ("__pycache__", ".pytest_cache", ".mypy_cache", ".git")
SKIP_TOP_DIR_PREFIX = "build"  # engine/build, engine/build-e3, ...: local build trees
SKIP_SUFFIXES = (".pyc", ".pyo")
SKIP_DIR_SUFFIXES = (".egg-info",)

# Files the deploy itself writes into a release; rsync must neither ship nor delete them.
RELEASE_OWN = ("/build/", "/build.log", "/selftest.log", "/.build-stamp", "/.build-rc")

RSYNC_EXCLUDES: tuple[str, ...] = (
    "--exclude=/build*/", *(f"--exclude={d}/" for d in SKIP_DIRS), *(f"--exclude=*{s}" for s in SKIP_SUFFIXES),
    *(f"--exclude=*{s}/" for s in SKIP_DIR_SUFFIXES), *(f"--exclude={p}" for p in RELEASE_OWN),
)

GOOD_SELFTEST = ("passed", "skipped: no GPU")


def disk_full_hint(output: str, root: str) -> str | None:
    """The hint for a deploy step whose output says the host's disk is full (ENOSPC), else None:
    the generic hints point at a log that the full disk has cut short."""
    if "No space left on device" not in output:
        return None
    return (f"the host's disk is full: free space under {root} (`df -h {root}` on the host; "
            "`ddtreectl status` warns 'disk low'), then deploy again; `current` was not touched")


def low_space_hint(avail_kib: int, need_kib: int, root: str) -> str | None:
    """The hint for a failed copy onto a host whose free space under `root` is below what one release
    takes, else None. rsync does not always pass on its receiver's 'No space left on device' (the
    receiver can die before the message crosses the link: exit 11 with nothing on stderr), so a failed
    copy asks the host for its free space instead of relying on the message."""
    if avail_kib >= need_kib:
        return None
    return (f"the host's disk is full: {avail_kib:,} KiB free under {root}, a release takes ~{need_kib:,} KiB; "
            f"free space there (`df -h {root}` on the host), then deploy again; `current` was not touched")


@dataclass(frozen=True)
class ShippedFile:
    path: str  # relative to the release root, "/"-separated (e.g. "src/status.cu", "templates/x.j2")
    digest: str  # sha256 of the content (of the link target text for a symlink)
    executable: bool


@dataclass(frozen=True)
class Manifest:
    """The shipped set and its id."""

    release_id: str
    files: tuple[ShippedFile, ...]

    @property
    def size(self) -> int:
        return len(self.files)


def _skipped_dir(name: str, top: bool) -> bool:
    if name in SKIP_DIRS or name.endswith(SKIP_DIR_SUFFIXES):
        return True
    return top and name.startswith(SKIP_TOP_DIR_PREFIX)


def walk_files(root: Path, prefix: str = "") -> list[ShippedFile]:
    """Every file under `root` that ships, sorted by path (`prefix` is prepended to each path)."""
    found: list[ShippedFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        top = Path(dirpath) == root
        dirnames[:] = sorted(d for d in dirnames if not _skipped_dir(d, top))
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(SKIP_SUFFIXES):
                continue
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if top and ("/" + rel) in RELEASE_OWN:
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                digest = hashlib.sha256(os.readlink(full).encode()).hexdigest()
            elif stat.S_ISREG(st.st_mode):
                digest = _file_digest(full)
            else:
                continue
            found.append(ShippedFile(prefix + rel, digest, bool(st.st_mode & 0o111)))
    return sorted(found, key=lambda f: f.path)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release_id(files: Iterable[ShippedFile], build_settings: Mapping[str, object]) -> str:
    """The short hex id of (files, build settings); order-independent, deterministic."""
    h = hashlib.sha256(b"ddtree-release-v1\n")
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.digest}\0{int(f.executable)}\n".encode())
    h.update(json.dumps(build_settings, sort_keys=True).encode())
    return h.hexdigest()[:ID_LENGTH]


def manifest(engine_dir: Path, templates_dir: Path | None, build_settings: Mapping[str, object]) -> Manifest:
    """The engine (release root) plus the templates (under `templates/`), and their id."""
    files = walk_files(engine_dir)
    if templates_dir is not None and templates_dir.is_dir():
        files += walk_files(templates_dir, "templates/")
    return Manifest(release_id(files, build_settings), tuple(files))


def stamp_text(release: str, *, archs: str, selftest: str, by: str, now: str, ninja_steps: int | None) -> str:
    """The `.build-stamp` JSON written into a release once it built and passed (or skipped) its self-test."""
    return json.dumps({"id": release, "time": now, "archs": archs, "selftest": selftest, "by": by,
                       "ninja_steps": ninja_steps}, sort_keys=True)


def stamp_good(text: str, release: str) -> bool:
    """Whether a stamp's text says `release` built and its self-test passed or was rightly skipped."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("id") == release and data.get("selftest") in GOOD_SELFTEST


def to_prune(releases: Mapping[str, float], keep: int, protected: Iterable[str | None]) -> list[str]:
    """Releases to delete: all but the `keep` newest (by mtime), never a protected one (the new
    release, `current`, the previous one). Returned oldest first."""
    guard = {p for p in protected if p}
    newest_first = sorted(releases, key=lambda r: (releases[r], r), reverse=True)
    kept = set(newest_first[:max(keep, 0)]) | guard
    return sorted((r for r in newest_first if r not in kept), key=lambda r: (releases[r], r))
