"""End-to-end: the INSTALLED `ddtreectl deploy|rollback|lock` against real systemd + sshd test hosts.

Real rsync over SSH, real CMake + ninja + nvcc on the host (through its overlay of this machine), real
systemd units. Builds are kept small for 2 cores: one op (draft_topk_lse) for one arch (sm_90),
chosen through the inventory's `build:` settings, exactly as an operator would.

The tests of one module share hosts and run in file order; each says what state it starts from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.e2e.host_setup import reference_service

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
UNIT = "ddtree-dp.service"
# The deployed release's own reference server: `deploy --restart` gates it like restore-service.
SERVICES = {"dp": reference_service("ddtree-dp", "dp", pythonpath="/opt/ddtree/current/python")}
BUILD = {"cuda_archs": ["90"], "cmake_args": ["-DDDTREE_OPS=draft_topk_lse", "-DDDTREE_BUILD_BENCH=OFF"]}
OP_SOURCE = "src/draft_topk_lse.cu"


def ddtreectl_argv(*args: str) -> list[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return [exe, *args]


def run(inventory: Path, *args: str, timeout: float = 900, columns: int = 200) -> tuple[int, str, str]:
    env = dict(os.environ, COLUMNS=str(columns))  # Rich tables: no cut-off release ids
    proc = subprocess.run(ddtreectl_argv("-i", str(inventory), *args), capture_output=True, text=True,
                          timeout=timeout, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def deploy_json(inventory: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(inventory, "deploy", "--json", *args)
    try:
        doc = json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}): {out!r}\n{err}") from None
    return code, doc, err


def current_of(host: Any) -> str:
    return os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1]


def releases_of(host: Any) -> list[str]:
    d = host.root / "opt/ddtree/releases"
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def tree_hash(host: Any, *paths: str) -> str:
    """Names, sizes, modes, mtimes, link targets and contents of everything under `paths` on the host."""
    listing = host.sh("find " + " ".join(paths) + " -printf '%p %s %m %T@ %l\\n' 2>/dev/null | sort; "
                      "find " + " ".join(paths) + " -type f -exec sha256sum {} + 2>/dev/null | sort",
                      check=False).stdout
    return hashlib.sha256(listing.encode()).hexdigest()


def release_hash(host: Any, release: str) -> str:
    return tree_hash(host, f"/opt/ddtree/releases/{release}")


def lock_owner(host: Any) -> dict[str, Any] | None:
    path = host.root / "opt/ddtree/state/locks/deploy.lock/owner.json"
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


def nvidia_smi_stub(gpus: str, apps: str) -> str:
    """An nvidia-smi that prints fixture output (these hosts have no GPU)."""
    return ("#!/bin/sh\ncase \"$1\" in\n"
            f"  --query-gpu=*) cat <<'EOF'\n{gpus}EOF\n  ;;\n"
            f"  --query-compute-apps=*) cat <<'EOF'\n{apps}EOF\n  ;;\n"
            "  *) exit 2 ;;\nesac\n")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the engine and templates beside the inventory (the tests edit sources)."""
    root = tmp_path_factory.mktemp("deploy")
    subprocess.run(["rsync", "-a", "--exclude=/build*/", "--exclude=__pycache__/", "--exclude=*.pyc",
                    f"{REPO}/engine/", f"{root}/engine/"], check=True)
    shutil.copytree(REPO / "templates", root / "templates")
    return root


@pytest.fixture(scope="module")
def hosts(testbed: Any, workspace: Path) -> Any:
    booted = testbed.boot(["dp-main", "dp-kill", "dp-lock"])
    by = {h.name: h for h in booted}
    overrides = {name: {"build": BUILD} for name in by}
    overrides["dp-main"]["service"] = "dp"
    testbed.inventory(booted, workspace / "hosts.yaml", services=SERVICES, host_overrides=overrides,
                      groups={"dp": sorted(by)})
    yield by
    testbed.shutdown_all(booted)


@pytest.fixture
def inv(workspace: Path, hosts: Any) -> Path:
    return workspace / "hosts.yaml"


@pytest.fixture
def engine_file(workspace: Path) -> Callable[[str, str | None], None]:
    """Set (or with None restore) a file of the test's engine copy; restored after the test."""
    originals: dict[Path, bytes | None] = {}

    def set_file(rel: str, content: str | None) -> None:
        path = workspace / "engine" / rel
        if path not in originals:
            originals[path] = path.read_bytes() if path.exists() else None
        if content is None:
            original = originals[path]
            if original is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(original)
        else:
            path.write_text(content)

    yield set_file  # type: ignore[misc]
    for path, original in originals.items():
        if original is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(original)


STATE: dict[str, str] = {}


def test_first_deploy_builds_skips_selftest_without_gpu_and_switches(inv: Path, hosts: Any) -> None:
    h = hosts["dp-main"]
    code, doc, err = deploy_json(inv, "--host", "dp-main")
    assert code == 0, err
    (r,) = doc["hosts"]
    assert r["action"] == "deployed" and r["built"] is True
    assert r["selftest"] == "skipped: no GPU"
    assert (r["archs"], r["archs_source"]) == ("90", "inventory")
    # status.cu + draft_topk_lse.cu (lib), main.cpp + draft_topk_lse_selftest.cu, two links
    assert r["ninja_steps"] == 6 and len(r["compiled"]) == 4
    assert current_of(h) == r["release"] and releases_of(h) == [r["release"]]
    rel = h.root / "opt/ddtree/releases" / r["release"]
    stamp = json.loads((rel / ".build-stamp").read_text())
    assert stamp["id"] == r["release"] and stamp["selftest"] == "skipped: no GPU" and stamp["archs"] == "90"
    assert (rel / "build/libddtree.so").is_file() and (rel / "build/ddtree-selftest").is_file()
    assert "Linking CUDA shared library libddtree.so" in (rel / "build.log").read_text()
    assert (rel / "CMakeLists.txt").is_file() and (rel / "templates/sglang-ddtree.service.j2").is_file()
    # Step 5 installed the unit (not started: deploy never starts a stopped service).
    assert (h.root / "etc/systemd/system" / UNIT).is_file()
    assert h.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    audit = [json.loads(line) for line in (h.root / "opt/ddtree/state/audit.log").read_text().splitlines()]
    assert audit[-1]["action"] == "deploy" and audit[-1]["release"] == r["release"]
    assert lock_owner(h) is None
    STATE["r1"] = r["release"]


def test_immediate_redeploy_is_a_noop(inv: Path, hosts: Any) -> None:
    h = hosts["dp-main"]
    ninja_log = h.root / "opt/ddtree/build/out/.ninja_log"
    before = (ninja_log.stat().st_mtime_ns, release_hash(h, STATE["r1"]))
    code, doc, err = deploy_json(inv, "--host", "dp-main")
    assert code == 0, err
    (r,) = doc["hosts"]
    assert (r["action"], r["built"], r["release"], r["units_changed"]) == ("noop", False, STATE["r1"], [])
    assert "sync" not in r["timings"] and "build" not in r["timings"]
    assert (ninja_log.stat().st_mtime_ns, release_hash(h, STATE["r1"])) == before
    assert releases_of(h) == [STATE["r1"]]


def test_one_changed_file_rebuilds_only_that_object(inv: Path, hosts: Any, workspace: Path) -> None:
    h = hosts["dp-main"]
    h.systemctl("start", UNIT)  # the service now runs from r1
    path = workspace / "engine" / OP_SOURCE
    path.write_text(path.read_text() + "\n// deploy test: one changed line\n")
    code, doc, err = deploy_json(inv, "--host", "dp-main")
    assert code == 0, err
    (r,) = doc["hosts"]
    assert r["action"] == "deployed" and r["previous"] == STATE["r1"] and r["release"] != STATE["r1"]
    assert r["compiled"] == ["CMakeFiles/ddtree.dir/src/draft_topk_lse.cu.o"]
    assert r["ninja_steps"] == 3  # that object, relink the library, relink the self-test
    r1 = h.root / "opt/ddtree/releases" / STATE["r1"]
    r2 = h.root / "opt/ddtree/releases" / r["release"]
    # Unchanged sources are hard links into the previous release; the changed one is not.
    assert (r1 / "CMakeLists.txt").stat().st_ino == (r2 / "CMakeLists.txt").stat().st_ino
    assert (r1 / OP_SOURCE).stat().st_ino != (r2 / OP_SOURCE).stat().st_ino
    # Artifacts are copies: the old release's library was not rewritten under it.
    assert (r1 / "build/libddtree.so").stat().st_ino != (r2 / "build/libddtree.so").stat().st_ino
    assert current_of(h) == r["release"]
    STATE["r2"] = r["release"]


def test_status_shows_restart_pending_until_restart(inv: Path, hosts: Any) -> None:
    h = hosts["dp-main"]
    code, out, err = run(inv, "status", "dp-main", "--json")
    assert code == 0, err
    rel = json.loads(out)["hosts"][0]["release"]
    assert (rel["current"], rel["running"], rel["restart_pending"]) == (STATE["r2"], STATE["r1"], True)
    assert f"restart pending: running release {STATE['r1']}, current {STATE['r2']}" in \
        json.loads(out)["hosts"][0]["warnings"]
    # Wide enough that the warnings column does not wrap the sentence (the table is ~200 columns here).
    code, out, err = run(inv, "status", "dp-main", columns=320)
    assert f"restart pending: running release {STATE['r1']}, current {STATE['r2']}" in out, out
    code, doc, err = deploy_json(inv, "--host", "dp-main", "--restart")
    assert code == 0, err
    assert doc["hosts"][0]["restarted"] is True and doc["hosts"][0]["action"] == "noop"
    assert doc["hosts"][0]["restart_verified"] is True
    code, out, err = run(inv, "status", "dp-main", "--json")
    rel = json.loads(out)["hosts"][0]["release"]
    assert (rel["running"], rel["restart_pending"]) == (STATE["r2"], False)
    h.systemctl("stop", UNIT)


def test_broken_source_fails_the_build_and_leaves_current(inv: Path, hosts: Any,
                                                           engine_file: Callable[[str, str | None], None],
                                                           workspace: Path) -> None:
    h = hosts["dp-main"]
    before = (current_of(h), releases_of(h), release_hash(h, STATE["r2"]))
    text = (workspace / "engine" / OP_SOURCE).read_text()
    engine_file(OP_SOURCE, text + "\nthis is not CUDA;\n")
    code, out, err = run(inv, "deploy", "--host", "dp-main")
    assert code == 5, (out, err)
    assert "build failed" in err and "current` unchanged" in err
    assert "error" in err and "draft_topk_lse.cu" in err  # the compiler's message, from the log tail
    assert "build.log" in err  # where the full log is
    assert (current_of(h), releases_of(h), release_hash(h, STATE["r2"])) == before
    assert lock_owner(h) is None
    last = json.loads((h.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert last["action"] == "deploy-failed" and "build failed" in last["error"]


def test_rollback_restores_the_previous_release(inv: Path, hosts: Any) -> None:
    h = hosts["dp-main"]
    assert current_of(h) == STATE["r2"]
    code, out, err = run(inv, "rollback", "--host", "dp-main", "--json")
    assert code == 0, err
    assert json.loads(out)["hosts"][0]["release"] == STATE["r1"]
    assert current_of(h) == STATE["r1"]
    audit = (h.root / "opt/ddtree/state/audit.log").read_text().splitlines()
    assert json.loads(audit[-1])["action"] == "rollback"
    code, out, err = run(inv, "rollback", "--host", "dp-main", "--to", "nosuchrelease")
    assert code == 2 and "does not exist" in err
    code, out, err = run(inv, "rollback", "--host", "dp-main", "--to", STATE["r2"])
    assert code == 0 and current_of(h) == STATE["r2"], err


def test_plan_changes_nothing(inv: Path, hosts: Any, engine_file: Callable[[str, str | None], None]) -> None:
    h = hosts["dp-main"]
    engine_file("src/plan_probe_note.txt", "a new file\n")
    unit_path = f"/etc/systemd/system/{UNIT}"
    h.write_file(unit_path, h.read_file(unit_path) + "# hand edit\n")
    watched = ("/opt/ddtree", "/etc/systemd/system")
    before = tree_hash(h, *watched)
    code, out, err = run(inv, "deploy", "--host", "dp-main", "--plan", "--json")
    assert code == 0, err
    (p,) = json.loads(out)["hosts"]
    assert p["build_needed"] is True and p["switch_needed"] is True and p["current"] == STATE["r2"]
    assert p["files"]["added"] == ["src/plan_probe_note.txt"]
    assert p["files"]["changed"] == [] and p["files"]["deleted"] == []
    assert any("differs from the rendered file" in u for u in p["units"])
    assert p["lock"] is None and p["gpus"].startswith("no GPU")
    assert tree_hash(h, *watched) == before
    code, out, err = run(inv, "deploy", "--host", "dp-main", "--plan")
    assert code == 0 and "1 added" in out and "+ src/plan_probe_note.txt" in out, out
    assert tree_hash(h, *watched) == before


def test_concurrent_deploys_one_refused_one_waits(inv: Path, hosts: Any) -> None:
    h = hosts["dp-lock"]
    first = subprocess.Popen(ddtreectl_argv("-i", str(inv), "deploy", "--host", "dp-lock", "--json"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: lock_owner(h) is not None, 120, "the first deploy to take the lock")
        code, out, err = run(inv, "deploy", "--host", "dp-lock")
        assert code == 8, (out, err)
        assert "deploy lock held by" in err and f"ddtreectl pid {first.pid}" in err
        code, doc, err = deploy_json(inv, "--host", "dp-lock", "--lock-wait", "600")
        assert code == 0, err
        assert doc["hosts"][0]["action"] == "noop"  # it waited; the first one had built the release
        out1, err1 = first.communicate(timeout=600)
        assert first.returncode == 0, err1
        assert json.loads(out1)["hosts"][0]["action"] == "deployed"
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert lock_owner(h) is None


def start_killable(inv: Path, host: str) -> subprocess.Popen[str]:
    return subprocess.Popen(ddtreectl_argv("-i", str(inv), "deploy", "--host", host), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def kill_group(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_kill_mid_rsync_and_mid_build_keeps_old_release(inv: Path, hosts: Any, workspace: Path,
                                                        engine_file: Callable[[str, str | None], None]) -> None:
    h = hosts["dp-kill"]
    code, doc, err = deploy_json(inv, "--host", "dp-kill")
    assert code == 0, err
    r1 = doc["hosts"][0]["release"]
    intact = release_hash(h, r1)
    releases = h.root / "opt/ddtree/releases"

    # 1. Mid-rsync: a big file makes the transfer last; kill ddtreectl's whole process group (with
    #    its rsync) once the host has a partial copy of it.
    blob = workspace / "engine/python/blob.bin"
    with open(blob, "wb") as fh:
        for _ in range(24):
            fh.write(os.urandom(8 << 20))
    try:
        proc = start_killable(inv, "dp-kill")
        wait_for(lambda: any(p.name.startswith(".blob.bin.") or p.name == "blob.bin"
                             for p in releases.glob(".incoming-*/python/*")), 120, "a partial transfer")
        kill_group(proc)
    finally:
        blob.unlink()
    assert current_of(h) == r1 and releases_of(h) == [r1] and release_hash(h, r1) == intact
    stale = lock_owner(h)
    assert stale is not None and f"pid {proc.pid}" in stale["reason"]  # left behind, automatic (TTL)
    assert stale["kind"] == "auto" and stale["ttl_s"] > 0
    code, out, err = run(inv, "status", "dp-kill", "--json")
    warnings = json.loads(out)["hosts"][0]["warnings"]
    assert any(w.startswith("deploy lock held by") and f"pid {proc.pid}" in w for w in warnings), warnings

    # 2. Mid-build: kill it while ninja runs on the host.
    engine_file(OP_SOURCE, (workspace / "engine" / OP_SOURCE).read_text() + "\n// kill test\n")
    proc = start_killable(inv, "dp-kill")
    wait_for(lambda: any("== ninja" in p.read_text(errors="replace")
                         for p in releases.glob(".incoming-*/build.log")), 300, "the build to start", 0.05)
    kill_group(proc)
    assert current_of(h) == r1 and releases_of(h) == [r1] and release_hash(h, r1) == intact

    # 3. The next deploy takes over the dead process's lock and succeeds.
    code, doc, err = deploy_json(inv, "--host", "dp-kill")
    assert code == 0, err
    r = doc["hosts"][0]
    assert r["action"] == "deployed" and r["previous"] == r1 and r["lock_took_over"]
    assert current_of(h) == r["release"] and lock_owner(h) is None
    audit = (h.root / "opt/ddtree/state/audit.log").read_text()
    assert '"action": "lock-takeover"' in audit
    # The killed sync left no release behind: pruning removed the staging directories.
    assert not list(releases.glob(".incoming-*"))


def test_lock_commands(inv: Path, hosts: Any) -> None:
    h = hosts["dp-lock"]
    h.sh("mkdir -p /opt/ddtree/state/locks/deploy.lock && printf '%s' "
         "'{\"owner\": \"alice@laptop\", \"reason\": \"maintenance\", \"since\": 1, \"kind\": \"manual\", "
         "\"ttl_s\": 0}' > /opt/ddtree/state/locks/deploy.lock/owner.json")
    code, out, err = run(inv, "lock", "status", "dp-lock")
    assert code == 8 and "alice@laptop" in out and "manual: never expires" in out, (out, err)
    code, out, err = run(inv, "deploy", "--host", "dp-lock")
    assert code == 8 and "alice@laptop" in err
    code, out, err = run(inv, "lock", "release", "dp-lock")
    assert code == 8 and "not yours" in err
    code, out, err = run(inv, "lock", "release", "dp-lock", "--force")
    assert code == 0 and "released" in out, err
    assert lock_owner(h) is None
    code, out, err = run(inv, "lock", "status", "dp-lock")
    assert code == 0 and "free" in out


def test_ctrl_c_mid_build_releases_the_lock_and_keeps_current(inv: Path, hosts: Any, workspace: Path,
                                                              engine_file: Callable[[str, str | None], None]) -> None:
    h = hosts["dp-kill"]
    before = current_of(h)
    intact = release_hash(h, before)
    releases = h.root / "opt/ddtree/releases"
    for old in releases.glob(".incoming-*/build.log"):
        old.unlink()
    engine_file(OP_SOURCE, (workspace / "engine" / OP_SOURCE).read_text() + "\n// ctrl-c test\n")
    proc = subprocess.Popen(ddtreectl_argv("-i", str(inv), "deploy", "--host", "dp-kill"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: any("== ninja" in p.read_text(errors="replace")
                             for p in releases.glob(".incoming-*/build.log")), 300, "the build to start", 0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err
    assert lock_owner(h) is None  # released on the way out, not left to expire
    assert current_of(h) == before and release_hash(h, before) == intact


def test_group_deploy_reaches_every_host_in_parallel(inv: Path, hosts: Any) -> None:
    code, doc, err = deploy_json(inv, "--group", "dp")
    assert code == 0, err
    results = {r["host"]: r for r in doc["hosts"]}
    assert sorted(results) == ["dp-kill", "dp-lock", "dp-main"] and doc["errors"] == []
    # Same sources and build settings: the same release id on every host, and each one current.
    assert len({r["release"] for r in results.values()}) == 1
    for name, host in hosts.items():
        assert current_of(host) == results[name]["release"]


def test_gpu_host_archs_detected_and_a_failing_selftest_keeps_current(testbed: Any, boot_hosts: Any,
                                                                      workspace: Path) -> None:
    """A host whose nvidia-smi reports an H200 (compute_cap 9.0) and the inventory says gpus: 1: the
    archs come from the GPU, and the self-test really runs there; this host has no CUDA device behind
    the stub, so it fails, and the deploy must stop before `current` (exit 5, its output shown)."""
    from tests.probes.fixtures import fixture

    (h,) = boot_hosts(["dp-gpu"], gpus_stub={"dp-gpu": nvidia_smi_stub(fixture("nvidia-smi-gpus-h200-1x.txt"), "")})
    inv = testbed.inventory([h], workspace / "gpu-hosts.yaml",
                            host_overrides={"dp-gpu": {"gpus": 1, "build": {"cmake_args": BUILD["cmake_args"]}}})
    code, doc, err = deploy_json(inv, "--host", "dp-gpu")
    assert code == 5, (doc, err)
    (e,) = doc["errors"]
    assert e["exit_code"] == 5 and e["error"].startswith("self-test failed (exit 2)")
    assert "no usable CUDA device" in e["error"]  # ddtree-selftest's own words, from the log tail
    assert "selftest.log" in e["hint"]
    assert not (h.root / "opt/ddtree/current").exists() and releases_of(h) == []
    staged = list((h.root / "opt/ddtree/releases").glob(".incoming-*"))
    assert len(staged) == 1 and (staged[0] / "build/ddtree-selftest").is_file()
    # The build used the GPU's arch, not the inventory's (none given here) or the engine default.
    assert "archs=90a " in (staged[0] / "build.log").read_text()
    assert lock_owner(h) is None
