"""Install a host's rendered units and detect drift (hand edits, drop-ins, NeedDaemonReload).

Each function is one round trip: a POSIX sh script built here from shlex-quoted parts. Whether a
daemon-reload is needed is decided from our own content hashes, never from a tool's "changed" flag.
"""

from __future__ import annotations

import base64
import difflib
import shlex
from dataclasses import dataclass

from ddtreectl.errors import RemoteCommandError
from ddtreectl.render.units import RenderedService
from ddtreectl.transport.base import Transport

DROPIN_DIRS = ("/etc/systemd/system", "/run/systemd/system")


@dataclass(frozen=True)
class InstalledState:
    """What is on the host now for one rendered service."""

    files: dict[str, str | None]  # path -> content (None: missing)
    dropins: dict[str, str]  # drop-in path -> content
    need_daemon_reload: bool | None  # None: unknown (no systemctl, unit not loaded)


@dataclass(frozen=True)
class Drift:
    """One difference between what ddtreectl would install and what the host has."""

    kind: str  # "missing" | "modified" | "drop-in" | "need-daemon-reload"
    path: str
    diff: str = ""

    def describe(self) -> str:
        return {
            "missing": f"{self.path}: not installed",
            "modified": f"{self.path}: differs from the rendered file (hand edit or older render)",
            "drop-in": f"{self.path}: drop-in overrides the rendered unit",
            "need-daemon-reload": f"{self.path}: changed on disk since systemd loaded it (NeedDaemonReload=yes)",
        }[self.kind]


def drift_hint(problems: list[Drift], host: str) -> str:
    """What repairs each kind of drift: a redeploy rewrites the rendered files (and reloads), but it
    installs no drop-ins and removes none, and it does not reload for a file it left alone."""
    kinds = {d.kind for d in problems}
    steps = []
    if kinds & {"modified", "missing"}:
        steps.append(f"`ddtreectl deploy --host {host}` reinstalls the rendered files")
    if "drop-in" in kinds:
        steps.append("remove the drop-in on the host (ddtreectl installs none, and a deploy leaves it), "
                     "then `systemctl daemon-reload`")
    elif "need-daemon-reload" in kinds and not kinds & {"modified", "missing"}:
        steps.append("`systemctl daemon-reload` on the host")
    return f"see `ddtreectl render {host} --diff`; " + "; ".join(steps + ["or --force to start it as installed"])


@dataclass(frozen=True)
class InstallResult:
    changed: tuple[str, ...]  # paths written
    daemon_reloaded: bool


def _read_script(rendered: RenderedService) -> str:
    lines = ["set -u"]
    for f in rendered.files:
        p = shlex.quote(f.path)
        lines.append(f'if [ -f {p} ]; then printf "FILE %s " {p}; base64 -w0 < {p}; echo; '
                     f'else printf "FILE %s -\\n" {p}; fi')
    for d in DROPIN_DIRS:
        pattern = shlex.quote(f"{d}/{rendered.unit}.d") + "/*.conf"
        lines.append(f'for f in {pattern}; do [ -f "$f" ] || continue; printf "DROPIN %s " "$f"; '
                     'base64 -w0 < "$f"; echo; done')
    unit = shlex.quote(rendered.unit)
    lines.append(f"if command -v systemctl >/dev/null 2>&1; then printf 'NEEDRELOAD %s\\n' "
                 f'"$(systemctl show -p NeedDaemonReload --value {unit} 2>/dev/null)"; fi')
    return "\n".join(lines) + "\n"


def parse_installed(output: str) -> InstalledState:
    """Parse the read script's output (pure; tested on fixtures)."""
    files: dict[str, str | None] = {}
    dropins: dict[str, str] = {}
    need_reload: bool | None = None
    for line in output.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("FILE", "DROPIN"):
            path, _, payload = rest.rpartition(" ")
            content = None if payload == "-" else base64.b64decode(payload).decode(errors="replace")
            if tag == "FILE":
                files[path] = content
            elif content is not None:
                dropins[path] = content
        elif tag == "NEEDRELOAD":
            need_reload = {"yes": True, "no": False}.get(rest.strip())
    return InstalledState(files=files, dropins=dropins, need_daemon_reload=need_reload)


def read_installed(transport: Transport, rendered: RenderedService, *, timeout: float = 30) -> InstalledState:
    """Fetch the installed copies of the rendered files, drop-ins and NeedDaemonReload (one round trip)."""
    result = transport.run("sh -s", stdin=_read_script(rendered).encode(), timeout=timeout)
    if not result.ok:
        raise RemoteCommandError(
            f"reading installed units failed (exit {result.exit_code}): {result.stderr.strip()[-400:]}",
            host=rendered.host,
        )
    return parse_installed(result.stdout)


def drift(rendered: RenderedService, installed: InstalledState) -> list[Drift]:
    """Every way the host differs from the rendered service (pure)."""
    found: list[Drift] = []
    for f in rendered.files:
        current = installed.files.get(f.path)
        if current is None:
            found.append(Drift("missing", f.path))
        elif current != f.content:
            diff = "".join(difflib.unified_diff(
                current.splitlines(keepends=True), f.content.splitlines(keepends=True),
                fromfile=f"{rendered.host}:{f.path} (installed)", tofile=f"{f.path} (rendered)"))
            found.append(Drift("modified", f.path, diff))
    for path, content in sorted(installed.dropins.items()):
        found.append(Drift("drop-in", path, content))
    if installed.need_daemon_reload:
        found.append(Drift("need-daemon-reload", rendered.unit_file.path))
    return found


def _install_script(rendered: RenderedService, to_write: list[str]) -> str:
    by_path = {f.path: f for f in rendered.files}
    lines = ["set -eu"]
    for path in to_write:
        f = by_path[path]
        payload = base64.b64encode(f.content.encode()).decode()
        p, tmp = shlex.quote(path), shlex.quote(f"{path}.ddtreectl-tmp")
        lines += [
            f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')}",
            f"printf %s {shlex.quote(payload)} | base64 -d > {tmp}",
            f"chmod {f.mode:o} {tmp}",
            f"mv -f {tmp} {p}",  # atomic within the directory
        ]
    unit_changed = any(p.endswith(".service") for p in to_write)
    if unit_changed:
        lines.append("systemctl daemon-reload")
    unit_path = shlex.quote(rendered.unit_file.path)
    # systemd-analyze exits 0 on unknown keys and bad values and only warns on stderr: capture it.
    lines.append(f"echo VERIFY-BEGIN; systemd-analyze verify {unit_path} 2>&1 >/dev/null || true; echo VERIFY-END")
    return "\n".join(lines) + "\n"


def install_units(
    transport: Transport, rendered: RenderedService, installed: InstalledState | None = None, *, timeout: float = 60
) -> InstallResult:
    """Write the rendered files whose content differs, daemon-reload exactly when a unit changed, and
    require `systemd-analyze verify` on the host to print nothing."""
    state = installed or read_installed(transport, rendered, timeout=timeout)
    to_write = [f.path for f in rendered.files if state.files.get(f.path) != f.content]
    result = transport.run("sh -s", stdin=_install_script(rendered, to_write).encode(), timeout=timeout)
    if not result.ok:
        raise RemoteCommandError(
            f"installing {rendered.unit} failed (exit {result.exit_code}): {result.stderr.strip()[-400:]}",
            hint="check the host's disk and permissions under /etc/systemd/system",
            host=rendered.host,
        )
    verify = result.stdout.split("VERIFY-BEGIN\n", 1)[-1].split("VERIFY-END", 1)[0].strip()
    if verify:
        raise RemoteCommandError(
            f"systemd-analyze verify {rendered.unit} reported problems:\n{verify}",
            hint="fix the template or the inventory values, then deploy again",
            host=rendered.host,
        )
    return InstallResult(changed=tuple(to_write), daemon_reloaded=any(p.endswith(".service") for p in to_write))
