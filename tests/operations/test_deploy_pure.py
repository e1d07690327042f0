"""Pure parts of deploy: release id hashing, arch detection, progress parsing, pruning, stamps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddtreectl.operations.build import archs_from_gpus, cap_to_arch, choose_archs, parse_ninja_step, summarize
from ddtreectl.operations.deploy import orphaned
from ddtreectl.operations.activate import parse_listing
from ddtreectl.operations.release import manifest, release_id, stamp_good, stamp_text, to_prune, walk_files
from ddtreectl.operations.remote_lock import LockInfo
from ddtreectl.operations.sync import parse_itemize, parse_progress2
from ddtreectl.probes.facts import GpuInfo, GpuState

SETTINGS = {"cuda_archs": "90", "cmake_args": ["-DDDTREE_OPS=draft_topk_lse"]}


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return root


def test_release_id_is_deterministic_and_content_based(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", {"CMakeLists.txt": "x", "src/k.cu": "k", "python/m.py": "m"})
    b = tree(tmp_path / "b", {"python/m.py": "m", "src/k.cu": "k", "CMakeLists.txt": "x"})
    ida = manifest(a, None, SETTINGS).release_id
    assert ida == manifest(b, None, SETTINGS).release_id
    assert len(ida) == 12 and int(ida, 16) >= 0
    (b / "src/k.cu").write_text("k2")
    assert manifest(b, None, SETTINGS).release_id != ida
    # The build settings are part of the id: another arch is another release.
    assert manifest(a, None, {**SETTINGS, "cuda_archs": "120"}).release_id != ida
    assert manifest(a, None, {**SETTINGS, "cmake_args": []}).release_id != ida


def test_release_id_ignores_build_trees_and_caches_but_not_templates(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", {"CMakeLists.txt": "x", "src/k.cu": "k"})
    base = manifest(a, None, SETTINGS).release_id
    tree(a, {"build/libddtree.so": "bin", "build-e3/x.o": "o", "python/__pycache__/m.cpython-311.pyc": "c",
             "python/stale.pyc": "c", "x.egg-info/PKG-INFO": "p", ".pytest_cache/v": "v"})
    assert manifest(a, None, SETTINGS).release_id == base
    assert [f.path for f in walk_files(a)] == ["CMakeLists.txt", "src/k.cu"]
    # A nested dir called build (not at the top) is a source dir and ships.
    tree(a, {"src/build/gen.h": "g"})
    assert "src/build/gen.h" in [f.path for f in walk_files(a)]
    templates = tree(tmp_path / "t", {"unit.service.j2": "u"})
    with_t = manifest(a, templates, SETTINGS)
    assert "templates/unit.service.j2" in [f.path for f in with_t.files]
    (templates / "unit.service.j2").write_text("u2")
    assert manifest(a, templates, SETTINGS).release_id != with_t.release_id


def test_exec_bit_is_part_of_the_id(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", {"run.sh": "#!/bin/sh\n"})
    before = manifest(a, None, SETTINGS).release_id
    os.chmod(a / "run.sh", 0o755)
    assert manifest(a, None, SETTINGS).release_id != before


def gpu(cap: str | None) -> GpuInfo:
    return GpuInfo(0, "GPU-x", "n", 0, 1000, 0, True, cap)


@pytest.mark.parametrize("cap,arch", [("9.0", "90a"), ("12.0", "120"), ("8.6", "86"), (" 10.0 ", "100"),
                                      ("[N/A]", None), ("", None), ("9", None)])
def test_cap_to_arch(cap: str, arch: str | None) -> None:
    assert cap_to_arch(cap) == arch


def test_arch_detection_and_fallbacks() -> None:
    mixed = GpuState("ok", (gpu("12.0"), gpu("9.0"), gpu("12.0")))
    assert archs_from_gpus(mixed) == ("90a", "120")
    assert choose_archs(mixed, ("80",)) == ("90a;120", "detected")
    none = GpuState("missing")
    assert choose_archs(none, ("90",)) == ("90", "inventory")
    assert choose_archs(none, ()) == ("", "engine default")
    assert choose_archs(GpuState("ok", (gpu(None),)), ("90",)) == ("90", "inventory")


def test_ninja_progress_parsing() -> None:
    assert parse_ninja_step("[0/2] Re-checking globbed directories...") is None
    assert parse_ninja_step("[2/4] Building CUDA object CMakeFiles/ddtree.dir/src/a.cu.o") == (
        2, 4, "Building CUDA object CMakeFiles/ddtree.dir/src/a.cu.o")
    assert parse_ninja_step("ninja: no work to do.") is None
    log = ["[0/2] Re-checking globbed directories...", "[1/3] Building CUDA object CMakeFiles/ddtree.dir/src/s.cu.o",
           "[2/3] Linking CUDA shared library libddtree.so", "[3/3] Linking CXX executable ddtree-selftest"]
    assert summarize(log) == (3, ("CMakeFiles/ddtree.dir/src/s.cu.o",))
    assert summarize(["ninja: no work to do."]) == (0, ())


def test_rsync_progress2_parsing() -> None:
    assert parse_progress2("      1,234,567  45%   12.34MB/s    0:00:01 (xfr#3, to-chk=10/65)") == (1234567, 45)
    assert parse_progress2("         32,768 100%    0.00kB/s    0:00:00 (xfr#1, to-chk=0/1)") == (32768, 100)
    assert parse_progress2("src/status.cu") is None
    assert parse_progress2("sent 1,234 bytes  received 35 bytes") is None


def test_itemize_parsing() -> None:
    out = ("cd+++++++++ src/\n>f+++++++++ src/new.cu\n>f.st...... src/old.cu\n>fc.t...... a.h\n"
           ".f...p..... mode-only.sh\n*deleting   gone.cu\n*deleting   olddir/\n.d..t...... ./\n")
    changes = parse_itemize(out)
    assert changes.added == ("src/new.cu",)
    assert changes.changed == ("src/old.cu", "a.h")
    assert changes.deleted == ("gone.cu",)
    assert parse_itemize("").empty


def test_prune_keeps_newest_and_protected() -> None:
    releases = {"r1": 1.0, "r2": 2.0, "r3": 3.0, "r4": 4.0, "r5": 5.0}
    assert to_prune(releases, 3, ()) == ["r1", "r2"]
    # `current` and the previous one survive even when old.
    assert to_prune(releases, 2, ("r1", "r2")) == ["r3"]
    assert to_prune(releases, 10, ()) == []
    assert to_prune({}, 2, ("x",)) == []


def test_stamp_roundtrip() -> None:
    text = stamp_text("abc", archs="90", selftest="skipped: no GPU", by="me@x", now="t", ninja_steps=3)
    assert json.loads(text)["archs"] == "90"
    assert stamp_good(text, "abc")
    assert not stamp_good(text, "abd")
    assert not stamp_good(stamp_text("abc", archs="90", selftest="failed (exit 1)", by="m", now="t",
                                     ninja_steps=1), "abc")
    assert not stamp_good("", "abc") and not stamp_good("{not json", "abc")


def test_listing_parse() -> None:
    text = ("CURRENT r2\nPREVIOUS r1\nRELEASE r1 100 " + stamp_text("r1", archs="90", selftest="passed", by="m",
            now="t", ninja_steps=1) + "\nRELEASE r2 200 \nSTAGED .incoming-r3\n")
    listing = parse_listing(text)
    assert listing.current == "r2" and listing.previous == "r1"
    assert listing.mtimes == {"r1": 100.0, "r2": 200.0}
    assert listing.good("r1") and not listing.good("r2")
    assert listing.staged == (".incoming-r3",)


def test_orphaned_lock_only_for_dead_pids_of_this_operator() -> None:
    dead = 2 ** 22 + 12345  # above the default pid_max: never a live process
    mine = LockInfo("deploy", "me@box", f"deploy r (ddtreectl pid {dead})", 1, "auto", 3600)
    assert orphaned(mine, "me@box")
    assert not orphaned(mine, "someone@else")
    alive = LockInfo("deploy", "me@box", f"deploy r (ddtreectl pid {os.getpid()})", 1, "auto", 3600)
    assert not orphaned(alive, "me@box")
    manual = LockInfo("deploy", "me@box", f"maintenance (ddtreectl pid {dead})", 1, "manual", 0)
    assert not orphaned(manual, "me@box")
    assert release_id([], {}) == release_id((), {})


def test_status_names_held_and_stale_locks() -> None:
    from ddtreectl.probes.checks import lock_warnings
    from ddtreectl.probes.facts import HostFacts, ReleaseState

    def facts(files: dict[str, str]) -> HostFacts:
        return HostFacts("h", "m", "b", 1.0, "k", "root", "systemd", GpuState("missing"), None,
                         ReleaseState("/opt/ddtree", True), None, state_files=files)

    record = {"owner": "me@box", "reason": "deploy (ddtreectl pid 42)", "since": 1000, "kind": "auto", "ttl_s": 3600}
    held = facts({"state/locks/deploy.lock/owner.json": json.dumps(record)})
    (w,) = lock_warnings(held, now=2000)
    assert w.startswith("deploy lock held by me@box since 1970-01-01 00:16:40 UTC: deploy (ddtreectl pid 42)")
    (w,) = lock_warnings(held, now=1000 + 3600 + 5)
    assert w.startswith("deploy lock STALE (automatic, expired 5 s ago), was held by me@box")
    manual = facts({"state/locks/deploy.lock/owner.json": json.dumps({**record, "kind": "manual", "ttl_s": 0})})
    assert lock_warnings(manual, now=10 ** 9)[0].endswith("(manual: never expires)")
    assert lock_warnings(facts({"state/mode.json": "{}"}), now=0) == []
    assert "unreadable" in lock_warnings(facts({"state/locks/x.lock/owner.json": "garbage"}), now=0)[0]
