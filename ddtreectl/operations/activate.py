"""Make a release live and keep the releases tidy: finalize a staged release (stamp + rename),
switch `current` atomically, list releases with their stamps, prune old ones, roll back.

`current` is swapped with `ln -sfn` to a temporary name and `mv -T` over the link (rename(2) is
atomic), so a reader sees the old or the new release, never a missing link. The release `current`
pointed to before the switch is recorded in `state/previous-release`: rollback's default target,
and never pruned.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddtreectl.errors import RemoteCommandError
from ddtreectl.operations.audit import remote_path
from ddtreectl.operations.release import stamp_good, to_prune
from ddtreectl.transport.base import Transport

_PRELUDE = r"""
set -u
root=$1; shift
case $root in "~/"*) root="$HOME/${root#"~/"}" ;; esac
"""

# Finalize: the stamp goes in first, then the staged directory is renamed to its final name, so a
# directory named like a release always holds a complete, built release.
_FINALIZE = _PRELUDE + r"""
id=$1; stamp=$2
inc="$root/releases/.incoming-$id"; final="$root/releases/$id"
printf '%s\n' "$stamp" > "$inc/.build-stamp.tmp" && mv -f "$inc/.build-stamp.tmp" "$inc/.build-stamp" || exit 3
rm -f "$inc/.build-rc" "$inc/.selftest-rc"
if [ -e "$final" ]; then mv -T "$final" "$root/releases/.replaced-$id.$$" && rm -rf "$root/releases/.replaced-$id.$$"; fi
mv -T "$inc" "$final" || exit 3
echo FINALIZED
"""

_SWITCH = _PRELUDE + r"""
id=$1
[ -f "$root/releases/$id/.build-stamp" ] || { echo "release $id has no build stamp" >&2; exit 3; }
old=
if [ -L "$root/current" ]; then old=$(readlink "$root/current"); old=${old%/}; old=${old##*/}; fi
if [ "$old" != "$id" ]; then
  mkdir -p "$root/state" || exit 3
  ln -sfn "releases/$id" "$root/.current.tmp.$$" && mv -T "$root/.current.tmp.$$" "$root/current" || exit 3
  if [ -n "$old" ]; then printf '%s\n' "$old" > "$root/state/previous-release.tmp" \
      && mv -f "$root/state/previous-release.tmp" "$root/state/previous-release"; fi
  echo "SWITCHED $old"
else
  echo "UNCHANGED"
fi
"""

_LIST = _PRELUDE + r"""
cur=
if [ -L "$root/current" ]; then cur=$(readlink "$root/current"); cur=${cur%/}; cur=${cur##*/}; fi
echo "CURRENT $cur"
prev=
[ -f "$root/state/previous-release" ] && read -r prev < "$root/state/previous-release"
echo "PREVIOUS $prev"
for r in "$root/releases"/*/; do
  [ -d "$r" ] || continue
  r=${r%/}; name=${r##*/}
  m=$(stat -c %Y "$r" 2>/dev/null || echo 0)
  s=$(head -c 4096 "$r/.build-stamp" 2>/dev/null | tr -d '\n')
  echo "RELEASE $name $m $s"
done
for r in "$root/releases"/.incoming-*/; do [ -d "$r" ] && { r=${r%/}; echo "STAGED ${r##*/}"; }; done
exit 0
"""


@dataclass(frozen=True)
class ReleaseListing:
    current: str | None
    previous: str | None
    mtimes: dict[str, float]
    stamps: dict[str, str]
    staged: tuple[str, ...]

    def good(self, release: str) -> bool:
        return stamp_good(self.stamps.get(release, ""), release)


def _sh(script: str, root: str, *args: str) -> str:
    return " ".join(shlex.quote(p) for p in ["sh", "-c", script, "ddtree-release", root, *args])


def _run(transport: Transport, script: str, root: str, *args: str, what: str) -> str:
    result = transport.run(_sh(script, root, *args), timeout=120)
    if not result.ok:
        raise RemoteCommandError(f"{what} failed (exit {result.exit_code}): {result.stderr.strip()[-400:]}",
                                 host=transport.host_name, hint="check the disk and permissions under the remote root")
    return result.stdout


def parse_listing(text: str) -> ReleaseListing:
    current = previous = None
    mtimes: dict[str, float] = {}
    stamps: dict[str, str] = {}
    staged: list[str] = []
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "CURRENT":
            current = rest.strip() or None
        elif tag == "PREVIOUS":
            previous = rest.strip() or None
        elif tag == "RELEASE":
            name, _, rest = rest.partition(" ")
            mtime, _, stamp = rest.partition(" ")
            mtimes[name] = float(mtime or 0)
            stamps[name] = stamp
        elif tag == "STAGED":
            staged.append(rest.strip())
    return ReleaseListing(current, previous, mtimes, stamps, tuple(staged))


def list_releases(transport: Transport, root: str) -> ReleaseListing:
    """Every release with its mtime and stamp, `current`, the recorded previous release (one round trip)."""
    return parse_listing(_run(transport, _LIST, root, what="listing releases"))


def finalize(transport: Transport, root: str, release: str, stamp: str) -> None:
    """Stamp the staged release and give it its final name."""
    _run(transport, _FINALIZE, root, release, stamp, what=f"finalizing release {release}")


def switch_current(transport: Transport, root: str, release: str) -> str | None:
    """Point `current` at `release` atomically; returns the release it pointed to before (None: no
    switch was needed or there was none)."""
    out = _run(transport, _SWITCH, root, release, what=f"switching current to {release}").strip()
    if out.startswith("SWITCHED"):
        return out[len("SWITCHED"):].strip() or None
    return None


def prune(transport: Transport, root: str, keep: int, protected: tuple[str | None, ...]) -> list[str]:
    """Delete releases beyond the newest `keep` (never a protected one) and leftover staging dirs."""
    listing = list_releases(transport, root)
    doomed = to_prune(listing.mtimes, keep, (*protected, listing.current, listing.previous))
    paths = [remote_path(root, "releases", r) for r in doomed]
    paths += [remote_path(root, "releases", s) for s in listing.staged]
    if paths:
        transport.run("rm -rf " + " ".join(paths), timeout=300)
    return doomed
