"""Build a staged release on its host (CMake + ninja) and run its self-test.

Incremental by design: every release builds in ONE stable per-host workspace, `<root>/build/`
(`src/` the sources, `out/` the CMake tree). A CMake tree cannot move, and a fresh one per release
would rebuild everything; instead the staged sources are copied into `build/src` by content
(`rsync --checksum`, no times kept), so a changed file gets a new mtime and an unchanged one keeps
its old one, and ninja rebuilds exactly what changed. The artifacts are then COPIED into the release
(never hard-linked: a linker may rewrite its output in place and change an old release under it).
A workspace `flock` serialises builds, including a build orphaned by a dropped connection, which
dies on its next write to the closed channel.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable

from ddtreectl.errors import RemoteCommandError
from ddtreectl.operations.audit import remote_path
from ddtreectl.operations.release import RELEASE_OWN, disk_full_hint
from ddtreectl.probes.facts import GpuState
from ddtreectl.transport.base import Transport

_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
_COMPILED = re.compile(r"Building \w+ object (\S+)")
ARTIFACTS = ("libddtree.so", "ddtree-selftest", "ddtree-bench")

ProgressFn = Callable[[int, int, str], None]  # (step, steps, what)


def archs_from_gpus(gpus: GpuState) -> tuple[str, ...]:
    """CUDA archs of the host's GPUs from nvidia-smi's compute_cap ("12.0" -> "120", "9.0" -> "90a"),
    unique and sorted numerically; () when no GPU answered."""
    found: set[str] = set()
    if gpus.status != "ok":
        return ()
    for gpu in gpus.gpus:
        arch = cap_to_arch(gpu.compute_cap or "")
        if arch:
            found.add(arch)
    return tuple(sorted(found, key=lambda arch: int(arch.rstrip("a"))))


def cap_to_arch(cap: str) -> str | None:
    """`9.0` -> `90a`: Hopper is built arch-specific, because the engine's wgmma tree-attention path
    exists only in sm_90a code (a plain sm_90 build falls back to a slower path)."""
    m = re.fullmatch(r"\s*(\d{1,2})\.(\d)\s*", cap)
    if m is None:
        return None
    arch = f"{int(m.group(1))}{m.group(2)}"
    return "90a" if arch == "90" else arch


def choose_archs(gpus: GpuState, configured: tuple[str, ...]) -> tuple[str, str]:
    """(archs as CMake wants them, e.g. "90;120" or "" for the engine default, where they came from)."""
    detected = archs_from_gpus(gpus)
    if detected:
        return ";".join(detected), "detected"
    if configured:
        return ";".join(configured), "inventory"
    return "", "engine default"


def parse_ninja_step(line: str) -> tuple[int, int, str] | None:
    """`[3/7] Building CUDA object ...` -> (3, 7, "Building CUDA object ..."); the glob re-check
    CMake adds before every build is not a build step."""
    m = _NINJA_STEP.match(line.strip())
    if m is None or "Re-checking globbed directories" in m.group(3):
        return None
    return int(m.group(1)), int(m.group(2)), m.group(3)


@dataclass(frozen=True)
class BuildOutcome:
    ok: bool
    exit_code: int
    steps: int  # ninja steps run (0: nothing to do)
    compiled: tuple[str, ...]  # object files compiled
    log_tail: str
    log_path: str


def summarize(lines: list[str]) -> tuple[int, tuple[str, ...]]:
    steps = 0
    compiled: list[str] = []
    for line in lines:
        step = parse_ninja_step(line)
        if step is None:
            continue
        steps = max(steps, step[1])
        m = _COMPILED.search(step[2])
        if m:
            compiled.append(m.group(1))
    return steps, tuple(compiled)


_BUILD = r"""
set -u
root=$1; id=$2; archs=$3; shift 3
case $root in "~/"*) root="$HOME/${root#"~/"}" ;; esac
PATH="$PATH:/usr/local/cuda/bin:/usr/local/bin"
export PATH
inc="$root/releases/.incoming-$id"; ws="$root/build"; log="$inc/build.log"
[ -d "$inc" ] || { echo "no staged release at $inc" >&2; exit 3; }
mkdir -p "$ws" || exit 3
# Copy what differs by content (no times kept: a changed file gets a new mtime, ninja sees it).
sync_src() {
  if command -v rsync >/dev/null 2>&1; then
    rsync -rlp --checksum --delete EXCLUDES --exclude=/templates/ "$inc/" "$ws/src/"
    return $?
  fi
  # No rsync on the host (minimal images): the same with find + cmp + cp.
  mkdir -p "$ws/src" || return $?
  (cd "$inc" && find . -type f ! -path './build/*' ! -path './templates/*' ! -name build.log \
      ! -name selftest.log ! -name .build-stamp ! -name .build-rc ! -name .selftest-rc) |
  while IFS= read -r f; do
    cmp -s "$inc/$f" "$ws/src/$f" && continue
    mkdir -p "$ws/src/${f%/*}" && cp "$inc/$f" "$ws/src/$f" || exit 1
  done || return $?
  (cd "$ws/src" && find . -type f) | while IFS= read -r f; do
    [ -e "$inc/$f" ] || rm -f "$ws/src/$f"
  done
}
build() {
  exec 9>"$ws/.lock"
  if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
    echo "== waiting for the build workspace (another build, or one orphaned by a dropped connection)"
    flock -w 1800 9 || { echo "build workspace $ws stayed locked for 30 min"; return 75; }
  fi
  echo "== sources -> $ws/src (changed files only)"
  sync_src || return $?
  config="archs=$archs args=$*"
  if [ ! -f "$ws/out/build.ninja" ] || [ "$(cat "$ws/out/.ddtreectl-config" 2>/dev/null)" != "$config" ]; then
    echo "== configure: $config"
    rm -rf "$ws/out"
    cmake -S "$ws/src" -B "$ws/out" -G Ninja -DDDTREE_CUDA_ARCHS="$archs" "$@" || return $?
    printf '%s' "$config" > "$ws/out/.ddtreectl-config"
  fi
  echo "== ninja"
  ninja -C "$ws/out" || return $?
  mkdir -p "$inc/build" || return $?
  for f in ARTIFACTS; do
    if [ -f "$ws/out/$f" ]; then cp -f "$ws/out/$f" "$inc/build/$f" || return $?; fi
  done
  echo "== artifacts copied into releases/.incoming-$id/build"
}
rm -f "$inc/.build-rc"
# The exit status travels through a pipe (fd 3), not a file: on a full disk a file write fails and
# the status was lost (`exit ""`). fds 3 and 4 are closed for the build itself, so a compiler
# daemon it starts cannot hold the command substitution open.
exec 4>&1
rc=$( { { build "$@" 3>&- 4>&-; echo "$?" >&3; } 2>&1 | tee "$log" >&4; } 3>&1 )
exit "${rc:-1}"
"""


def build_script() -> str:
    excludes = " ".join(f"--exclude={shlex.quote(p)}" for p in RELEASE_OWN)
    return _BUILD.replace("EXCLUDES", excludes).replace("ARTIFACTS", " ".join(ARTIFACTS))


def build_release(
    transport: Transport, root: str, release: str, archs: str, cmake_args: tuple[str, ...], *,
    timeout: float, on_step: ProgressFn | None = None, on_line: Callable[[str], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> BuildOutcome:
    """Build the staged release `.incoming-<id>` in the host's workspace; the log lands in the release."""
    lines: list[str] = []

    def line(text: str) -> None:
        lines.append(text)
        if on_line is not None:
            on_line(text)
        step = parse_ninja_step(text)
        if step is not None and on_step is not None:
            on_step(*step)

    command = " ".join(shlex.quote(p) for p in ["sh", "-c", build_script(), "ddtree-build", root, release, archs,
                                                 *cmake_args])
    result = transport.run(command, timeout=timeout, on_line=line, on_tick=on_tick)
    steps, compiled = summarize(lines)
    tail = "\n".join(lines[-25:]) + (("\n" + result.stderr.strip()[-1000:]) if result.stderr.strip() else "")
    return BuildOutcome(result.ok, result.exit_code, steps, compiled, tail,
                        f"{root.rstrip('/')}/releases/.incoming-{release}/build.log")


@dataclass(frozen=True)
class SelftestOutcome:
    verdict: str  # "passed" | "skipped: no GPU" | "failed" | "no GPU but the inventory expects N"
    ok: bool
    tail: str = ""


def run_selftest(transport: Transport, root: str, release: str, *, has_gpu: bool, expected_gpus: int,
                 timeout: float, on_line: Callable[[str], None] | None = None,
                 on_tick: Callable[[], None] | None = None) -> SelftestOutcome:
    """Run the release's `ddtree-selftest` on the host's GPU (log: `<release>/selftest.log`)."""
    if not has_gpu:
        if expected_gpus > 0:
            return SelftestOutcome(f"failed: no GPU answered, the inventory expects {expected_gpus}", False)
        return SelftestOutcome("skipped: no GPU", True)
    inc = remote_path(root, "releases", f".incoming-{release}")
    # The exit status travels through a pipe (fd 3), as the build's does: a status file is one more
    # write that a full disk refuses, and the status read back was then empty or a made-up 1.
    script = (f"cd {inc}/build || exit 3; exec 4>&1; "
              'rc=$( { { ./ddtree-selftest 3>&- 4>&-; echo "$?" >&3; } 2>&1 | tee ../selftest.log >&4; } 3>&1 ); '
              'exit "${rc:-1}"')
    lines: list[str] = []

    def line(text: str) -> None:
        lines.append(text)
        if on_line is not None:
            on_line(text)

    result = transport.run(script, timeout=timeout, on_line=line, on_tick=on_tick)
    tail = "\n".join(lines[-25:])
    if result.ok:
        return SelftestOutcome("passed", True, tail)
    return SelftestOutcome(f"failed (exit {result.exit_code})", False, tail + result.stderr[-500:])


def require_built(outcome: BuildOutcome, host: str, root: str) -> None:
    if not outcome.ok:
        raise RemoteCommandError(
            f"build failed (exit {outcome.exit_code}); `current` unchanged. Log tail:\n{outcome.log_tail}",
            hint=disk_full_hint(outcome.log_tail, root) or f"full log on the host: {outcome.log_path}", host=host)
