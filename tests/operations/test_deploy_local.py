"""Deploy through the `local` transport (the GPU machine's path): a real CMake + ninja + nvcc build,
here also WITHOUT rsync on the PATH (minimal GPU images), where files are linked/copied in Python and
the build workspace is synced with find + cmp + cp. Incrementality must hold either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ddtreectl.operations.release import walk_files
from ddtreectl.operations.sync import copy_local

REPO = Path(__file__).resolve().parents[2]


def test_copy_local_links_unchanged_copies_changed_and_deletes_gone(tmp_path: Path) -> None:
    src = tmp_path / "engine"
    (src / "src").mkdir(parents=True)
    (src / "src/a.cu").write_text("a")
    (src / "src/b.cu").write_text("b")
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o755)
    r1 = tmp_path / "releases/r1"
    assert copy_local(tuple(walk_files(src)), src, None, r1, None) == 3
    assert os.access(r1 / "run.sh", os.X_OK)
    (src / "src/b.cu").write_text("b2")
    (src / "src/a2.cu").write_text("new")
    os.unlink(src / "run.sh")
    r2 = tmp_path / "releases/r2"
    (r2 / "build").mkdir(parents=True)
    (r2 / "build/libddtree.so").write_text("artifact")  # the release's own files are never deleted
    (r2 / "stale.cu").parent.mkdir(parents=True, exist_ok=True)
    (r2 / "stale.cu").write_text("left by an interrupted copy")
    assert copy_local(tuple(walk_files(src)), src, None, r2, r1) == 2
    assert (r2 / "src/a.cu").stat().st_ino == (r1 / "src/a.cu").stat().st_ino
    assert (r2 / "src/b.cu").read_text() == "b2" and (r1 / "src/b.cu").read_text() == "b"
    assert not (r2 / "run.sh").exists() and not (r2 / "stale.cu").exists()
    assert (r2 / "build/libddtree.so").read_text() == "artifact"


def _tools_missing() -> str | None:
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        return "nvcc not installed"
    if shutil.which("ddtreectl") is None:
        return "the CLI is not installed (pip install -e .)"
    return None


def _path_without_rsync(tmp_path: Path) -> str:
    """A PATH with every tool of this machine but rsync (symlinks)."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for d in os.environ.get("PATH", "").split(":") + ["/usr/local/bin", "/usr/bin", "/bin"]:
        if not d or not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name != "rsync" and not (shadow / name).exists():
                (shadow / name).symlink_to(os.path.join(d, name))
    return str(shadow)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rsync", [True, False], ids=["rsync", "no-rsync"])
def test_local_deploy_builds_incrementally(tmp_path: Path, rsync: bool) -> None:
    missing = _tools_missing()
    if missing:
        pytest.skip(missing)
    work = tmp_path / "w"
    shutil.copytree(REPO / "engine", work / "engine",
                    ignore=lambda d, names: [n for n in names if n == "__pycache__"
                                             or (Path(d) == REPO / "engine" and n.startswith("build"))])
    (work / "hosts.yaml").write_text(
        "hosts:\n  here:\n    transport: local\n    remote_root: " + str(work / "root") + "\n"
        "    build:\n      cuda_archs: ['90']\n      cmake_args: [-DDDTREE_OPS=draft_topk_lse]\n")
    env = dict(os.environ)
    if not rsync:
        env["PATH"] = _path_without_rsync(tmp_path)
        assert shutil.which("rsync", path=env["PATH"]) is None
    exe = shutil.which("ddtreectl")
    assert exe is not None

    def deploy() -> dict[str, object]:
        proc = subprocess.run([exe, "-i", str(work / "hosts.yaml"), "deploy", "here", "--json"],
                              capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout)["hosts"][0])

    first = deploy()
    assert (first["action"], first["ninja_steps"], first["selftest"]) == ("deployed", 6, "skipped: no GPU")
    assert deploy()["action"] == "noop"
    with open(work / "engine/src/status.cu", "a") as fh:
        fh.write("\n// one changed line\n")
    second = deploy()
    assert second["compiled"] == ["CMakeFiles/ddtree.dir/src/status.cu.o"] and second["ninja_steps"] == 3
    releases = work / "root/releases"
    r1, r2 = releases / str(first["release"]), releases / str(second["release"])
    assert (r1 / "CMakeLists.txt").stat().st_ino == (r2 / "CMakeLists.txt").stat().st_ino
    assert (r1 / "src/status.cu").read_text() != (r2 / "src/status.cu").read_text()
    assert os.readlink(work / "root/current") == f"releases/{second['release']}"


def test_an_interrupt_ends_the_copy_at_once(tmp_path: Path) -> None:
    """run_rsync's on_tick runs while the transfer is quiet, and what it raises ends it with rsync killed:
    a deploy stopped by SIGTERM (which reaches ddtreectl alone, not its rsync) left rsync copying into the
    release after ddtreectl had exited and released the deploy lock."""
    import time

    from ddtreectl.errors import InterruptedByOperatorError
    from ddtreectl.operations.sync import run_rsync

    pidfile = tmp_path / "rsync.pid"
    stand_in = ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"]  # an rsync that goes quiet
    started = time.monotonic()

    def tick() -> None:
        if pidfile.exists() and time.monotonic() - started > 0.5:
            raise InterruptedByOperatorError("interrupted")

    with pytest.raises(InterruptedByOperatorError):
        run_rsync(stand_in, host="box", timeout=120, on_tick=tick)
    assert time.monotonic() - started < 10
    assert not os.path.exists(f"/proc/{pidfile.read_text().strip()}"), "the copy outlived the interrupt"
