"""Find stale references to an old address: in the project's files and in units installed on hosts.

After an IP move the old address lingers in templates, READMEs, scripts and, worse, in units already
installed on OTHER hosts (a multi-node peer's `--dist-init-addr`). The grep an operator would run by
hand silently skipped what it could not read and matched `10.1.2.20` inside `10.1.2.200`; here the
match is on whole addresses, binary files are skipped on purpose, and every place is file:line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ddtreectl.operations.audit import remote_path
from ddtreectl.transport.base import Transport

UNIT_DIR = "/etc/systemd/system"
# Build outputs, caches and VCS data: never a place an operator would fix a reference by hand.
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox",
    ".venv", "venv", "node_modules", "build", "dist", ".eggs",
})
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_LINE_CHARS = 200


@dataclass(frozen=True)
class StaleRef:
    """One line that mentions the old address: `path:line: text` (path relative for project files)."""

    path: str
    line: int
    text: str

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def address_pattern(address: str) -> re.Pattern[str]:
    """Matches `address` as a whole address: `10.1.2.200` in `10.1.2.200:5000`, `@10.1.2.200` or
    `[fe80::1]:22`, never inside `110.1.2.200`, `10.1.2.2001`, `10.1.2.200.5` or `fe80::12`."""
    if ":" in address:  # IPv6: a ':' next to it continues the address
        return re.compile(r"(?<![\w:.])" + re.escape(address) + r"(?![\w:.])")
    return re.compile(r"(?<![\w.-])" + re.escape(address) + r"(?![\w-]|\.\w)")


def _project_files(root: Path) -> list[Path]:
    """Tracked and untracked-but-not-ignored files when `root` is in a git work tree (so
    .gitignore'd build outputs are skipped), else every file outside SKIP_DIRS."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=20, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    if proc is not None and proc.returncode == 0:
        names = [n for n in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
        return [root / n for n in dict.fromkeys(names) if not (set(Path(n).parts) & SKIP_DIRS)]
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        found.extend(Path(dirpath) / f for f in sorted(filenames))
    return found


def sweep_project(
    root: Path, old: str, *, contents: Mapping[Path, str] | None = None
) -> tuple[list[StaleRef], list[str]]:
    """(references, files skipped with why) for every text file of the project under `root`.

    `contents` overrides what is on disk (a dry run sweeps the inventory as it WOULD be).
    """
    pattern = address_pattern(old)
    overrides = {Path(os.path.abspath(p)): text for p, text in (contents or {}).items()}
    refs: list[StaleRef] = []
    skipped: list[str] = []
    for path in _project_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            if path.is_symlink() or not path.is_file() or path.suffix == ".log":
                continue  # logs record old addresses on purpose
            if Path(os.path.abspath(path)) in overrides:
                data = overrides[Path(os.path.abspath(path))].encode()
            elif path.stat().st_size > MAX_FILE_BYTES:
                skipped.append(f"{rel} (larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB)")
                continue
            else:
                data = path.read_bytes()
        except OSError as err:
            skipped.append(f"{rel} ({err.strerror or err})")  # said, not silently ignored
            continue
        if b"\0" in data[:8192] or old.encode() not in data:
            continue  # binary (build output, image), or cannot match
        text = data.decode("utf-8", "replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if pattern.search(line):
                refs.append(StaleRef(rel, number, _clip(line)))
    return refs, skipped


def remote_sweep_command(old: str, remote_root: str) -> str:
    """ONE command for a host: grep the installed units and the remote root for `old`.

    `-I` skips binaries, `-w -F` pre-filters whole words (refined by address_pattern), `-Z` ends
    file names with NUL so any path parses; logs (the audit log records old addresses on purpose)
    are excluded. Exit 1 (nothing found) is success; 2 (an unreadable place) is reported.
    """
    places = f"{shlex.quote(UNIT_DIR)} {remote_path(remote_root)}"
    return (
        f"for d in {places}; do [ -d \"$d\" ] && set -- \"$@\" \"$d\"; done; "
        f"[ $# -eq 0 ] && exit 0; "
        f"grep -rnIwFZ --exclude-dir=.git --exclude-dir=__pycache__ --exclude='*.log' "
        f"-e {shlex.quote(old)} \"$@\"; rc=$?; [ $rc -le 1 ] || exit $rc"
    )


def parse_remote_sweep(stdout: str, old: str) -> list[StaleRef]:
    """Pure parser of `grep -nZ` output lines: `path\\0line:text`."""
    pattern = address_pattern(old)
    refs: list[StaleRef] = []
    for raw in stdout.splitlines():
        path, sep, rest = raw.partition("\0")
        number, colon, text = rest.partition(":")
        if not sep or not colon or not number.isdigit() or not pattern.search(text):
            continue
        refs.append(StaleRef(path, int(number), _clip(text)))
    return refs


def sweep_host(transport: Transport, old: str, remote_root: str, *, timeout: float) -> list[StaleRef]:
    """Installed units and files under the remote root on one host that mention `old`."""
    from ddtreectl.errors import RemoteCommandError

    result = transport.run(remote_sweep_command(old, remote_root), timeout=timeout)
    if not result.ok:
        raise RemoteCommandError(
            f"stale-reference grep failed (exit {result.exit_code}): {result.stderr.strip()[:200]}",
            hint="check that grep works on the host and the remote root is readable",
            host=transport.host_name,
        )
    return parse_remote_sweep(result.stdout, old)


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."
