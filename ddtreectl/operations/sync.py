"""Ship a release's files to a host with rsync: into a staging directory, hard-linking unchanged
files from the previous release, with `--info=progress2` parsed into a progress callback.

rsync runs on this machine, over the transport's own OpenSSH argv (the host key pinned by host name)
or as a plain local copy for a `local` host. It stays in ddtreectl's process group, so Ctrl-C or a
kill of ddtreectl ends it too; the receiving side then drops its temporary files.
"""

from __future__ import annotations

import hashlib
import os
import re
import selectors
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ddtreectl.errors import ConnectError, DdtreeError, RemoteCommandError
from ddtreectl.operations.audit import remote_path
from ddtreectl.operations.release import RSYNC_EXCLUDES, ShippedFile, disk_full_hint, low_space_hint
from ddtreectl.probes.parse import parse_df
from ddtreectl.transport.base import Transport

_PROGRESS2 = re.compile(r"^\s*([\d,.]+)\s+(\d{1,3})%")
ProgressFn = Callable[[int, int], None]  # (bytes done, percent)


def parse_progress2(chunk: str) -> tuple[int, int] | None:
    """One `--info=progress2` update (`  1,234,567  45%  12.34MB/s  0:00:01 (xfr#3, to-chk=10/65)`)
    -> (bytes, percent); None for anything else (file names, summary lines)."""
    m = _PROGRESS2.match(chunk)
    if m is None:
        return None
    digits = re.sub(r"[,.]", "", m.group(1))
    return (int(digits), min(100, int(m.group(2)))) if digits.isdigit() else None


@dataclass(frozen=True)
class FileChanges:
    """What an rsync dry run would do, by path."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.deleted)


def parse_itemize(text: str) -> FileChanges:
    """Parse `--itemize-changes` output: `>f+++++++++ new`, `>f.st...... changed`, `*deleting old`.
    Directories and attribute-only updates are not file changes."""
    added: list[str] = []
    changed: list[str] = []
    deleted: list[str] = []
    for line in text.splitlines():
        if line.startswith("*deleting "):
            path = line[len("*deleting "):].strip()
            if not path.endswith("/"):
                deleted.append(path)
            continue
        flags, _, path = line.partition(" ")
        if len(flags) != 11 or flags[1] not in "fL" or flags[0] not in "<>ch.":
            continue
        if "+++++++++" in flags:
            added.append(path)
        elif flags[0] in "<>c" or flags[2] == "c":
            changed.append(path)
    return FileChanges(tuple(added), tuple(changed), tuple(deleted))


def remote_dir_arg(transport: Transport, path: str) -> str:
    """rsync's destination for `path` on the host; a `~/` root becomes home-relative for SSH."""
    ssh = transport.rsync_ssh_command()
    if ssh is not None and path.startswith("~/"):
        path = path[2:]
    return transport.rsync_destination(path.rstrip("/") + "/")


def rsync_argv(
    transport: Transport,
    sources: list[str],
    dest_dir: str,
    *,
    link_dest: str | None = None,
    dry_run: bool = False,
    checksum: bool = False,
) -> list[str]:
    """The full rsync argv (pure but for the transport's ssh argv). `sources` are local paths:
    `dir/` ships a directory's contents, `dir` ships the directory itself."""
    argv = ["rsync", "-a", "--delete", "--no-inc-recursive", *RSYNC_EXCLUDES]
    ssh = transport.rsync_ssh_command()
    if ssh is not None:
        argv += ["-e", shlex.join(ssh)]
    if link_dest:
        argv.append(f"--link-dest={link_dest}")  # relative paths are relative to the destination
    if dry_run:
        argv += ["--dry-run", "--itemize-changes"]
    else:
        argv.append("--info=progress2")
    if checksum:
        argv.append("--checksum")
    return argv + sources + [remote_dir_arg(transport, dest_dir)]


@dataclass
class RsyncOutcome:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    updates: int = 0
    last_percent: int | None = field(default=None)


def run_rsync(argv: list[str], *, host: str, timeout: float, on_progress: ProgressFn | None = None,
              remote_root: str = "the remote root", on_tick: Callable[[], None] | None = None) -> RsyncOutcome:
    """Run rsync, feeding progress updates (split on CR and LF) to `on_progress`. Raises
    ConnectError when ssh could not reach the host (rsync exit 255), RemoteCommandError otherwise.
    `on_tick` runs at least once a second; what it raises ends the transfer (rsync is killed): a
    deploy interrupted by SIGTERM (not a terminal's Ctrl-C, which reaches rsync itself) left it
    copying into the release after ddtreectl had exited and released the deploy lock."""
    started = time.monotonic()
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    outcome = RsyncOutcome(0, "", "", 0.0)
    pending = b""
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                if on_tick is not None:
                    on_tick()
                if time.monotonic() - started > timeout:
                    proc.kill()
                    raise RemoteCommandError(f"rsync did not finish within {timeout:g} s", host=host,
                                             hint="check the link to the host; a rerun resumes the transfer")
                for key, _ in sel.select(1.0):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.extend(data)
                    if key.data is out:
                        pending += data
                        *chunks, pending = re.split(rb"[\r\n]", pending)
                        for chunk in chunks:
                            parsed = parse_progress2(chunk.decode("utf-8", "replace"))
                            if parsed is not None:
                                outcome.updates += 1
                                outcome.last_percent = parsed[1]
                                if on_progress is not None:
                                    on_progress(*parsed)
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    outcome.exit_code = code
    outcome.stdout = out.decode("utf-8", "replace")
    outcome.stderr = err.decode("utf-8", "replace")
    outcome.duration_s = time.monotonic() - started
    if code == 255:
        raise ConnectError(f"rsync could not reach the host: {outcome.stderr.strip()[-300:]}", host=host,
                           hint="check `ddtreectl status` for the host; the deploy changed nothing there")
    if code != 0:
        raise RemoteCommandError(f"rsync failed (exit {code}): {outcome.stderr.strip()[-400:]}", host=host,
                                 hint=disk_full_hint(outcome.stderr, remote_root)
                                 or f"check free disk space under {remote_root} and that rsync is installed")
    return outcome


def sources_for(engine_dir: Path, templates_dir: Path | None) -> list[str]:
    """rsync sources: the engine's contents at the release root, the templates under templates/."""
    sources = [str(engine_dir).rstrip("/") + "/"]
    if templates_dir is not None and templates_dir.is_dir():
        sources.append(str(templates_dir).rstrip("/"))
    return sources


def copy_local(files: tuple[ShippedFile, ...], engine_dir: Path, templates_dir: Path | None, dest: Path,
               link_dest: Path | None, on_progress: ProgressFn | None = None) -> int:
    """rsync's job for a `local` host on a machine without rsync (minimal GPU images): hard-link
    files whose content matches the previous release, copy the rest (with their mtimes), delete
    files that no longer ship. Returns the number of files copied (not linked)."""
    from ddtreectl.operations.release import walk_files

    copied = 0
    for i, f in enumerate(files):
        source = source_of(f, engine_dir, templates_dir)
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and not target.is_symlink() and _digest(target) == f.digest):
            previous = link_dest / f.path if link_dest is not None else None
            tmp = target.with_name(f".{target.name}.ddtreectl-tmp")
            tmp.unlink(missing_ok=True)
            if previous is not None and previous.is_file() and not previous.is_symlink() \
                    and _digest(previous) == f.digest:
                os.link(previous, tmp)
            else:
                shutil.copy2(source, tmp, follow_symlinks=False)
                copied += 1
            os.replace(tmp, target)
        if on_progress is not None:
            on_progress(i + 1, (i + 1) * 100 // max(1, len(files)))
    wanted = {f.path for f in files}
    for existing in walk_files(dest):  # skips the release's own build/, build.log, stamp
        if existing.path not in wanted:
            (dest / existing.path).unlink()
    return copied


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_of(f: ShippedFile, engine_dir: Path, templates_dir: Path | None) -> Path:
    """Where a shipped file comes from on this machine."""
    if f.path.startswith("templates/") and templates_dir is not None:
        return templates_dir / f.path[len("templates/"):]
    return engine_dir / f.path


def shipped_kib(files: tuple[ShippedFile, ...], engine_dir: Path, templates_dir: Path | None) -> int:
    """What one copy of the shipped files takes on the host's disk, in KiB (whole 4 KiB blocks per file)."""
    total = 0
    for f in files:
        try:
            total += -(-os.lstat(source_of(f, engine_dir, templates_dir)).st_size // 4096) * 4
        except OSError:
            continue
    return total


def explain_failed_copy(err: RemoteCommandError, transport: Transport, root: str, need_kib: int) -> RemoteCommandError:
    """A failed copy's error, with the host's free space under `root` when that is below what a release
    takes (the disk-full hint), else `err` unchanged. Needed because rsync can fail with exit 11 and an
    empty stderr when its receiver runs out of space, so the message alone cannot say why."""
    if err.hint is not None and "disk is full" in err.hint:
        return err
    try:
        result = transport.run(f"df -P -k {remote_path(root)}", timeout=15)
    except DdtreeError:
        return err  # the original error says more than a failed probe would
    disk = parse_df(result.stdout) if result.exit_code == 0 else None
    hint = low_space_hint(disk.avail_kib, need_kib, root) if disk is not None else None
    if disk is None or hint is None:
        return err
    said = err.message.rstrip().rstrip(":")  # "rsync failed (exit 11):" when rsync said nothing
    return RemoteCommandError(f"{said}; {disk.avail_kib:,} KiB free under {root}", host=err.host, hint=hint)
