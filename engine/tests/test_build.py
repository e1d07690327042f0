"""CI guard: the engine compiles with nvcc + CMake + ninja for sm_90 (H200) and sm_120 (RTX PRO 6000).

Runs on every CI run (no GPU needed); skips only when nvcc is absent. The build goes to a temporary
directory so it never touches a developer's engine/build. ptxas reports are kept in the log so that a
spill (local-memory traffic) fails the test: kernels here are meant to live in registers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1]


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def _run(cmd: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-20000:]}"
    return proc.stdout


@pytest.mark.timeout(1800)
def test_engine_compiles_for_sm90_and_sm120(tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA compile check needs the CUDA toolkit")
    for tool in ("cmake", "ninja"):
        assert shutil.which(tool), f"{tool} is required to build the engine (scripts/test installs it)"
    env = dict(os.environ, CUDACXX=nvcc)
    build = tmp_path / "build"
    start = time.monotonic()
    _run(["cmake", "-S", str(ENGINE), "-B", str(build), "-G", "Ninja", "-DDDTREE_CUDA_ARCHS=90a;120",
          "-DDDTREE_PTXAS_VERBOSE=ON", "-DCMAKE_BUILD_TYPE=Release"], env)
    log = _run(["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 2)], env)
    elapsed = time.monotonic() - start
    print(f"engine build for sm_90a+sm_120: {elapsed:.0f} s")

    lib = build / "libddtree.so"
    assert lib.is_file(), "libddtree.so was not produced"
    assert (build / "ddtree-selftest").is_file(), "ddtree-selftest was not produced"

    # Both architectures' machine code is in the library (cuobjdump lists one ELF per arch).
    cuobjdump = Path(nvcc).with_name("cuobjdump")
    if cuobjdump.is_file():
        listing = _run([str(cuobjdump), "--list-elf", str(lib)], env)
        for arch in ("sm_90a", "sm_120"):
            assert arch in listing, f"no {arch} code in libddtree.so:\n{listing}"

    # Only the C ABI is exported: every exported function starts with ddtree_.
    nm = shutil.which("nm")
    if nm:
        symbols = _run([nm, "-D", "--defined-only", str(lib)], env)
        exported = [line.split()[-1] for line in symbols.splitlines() if re.search(r" T ", line)]
        assert exported, "libddtree exports nothing"
        stray = [s for s in exported if not s.startswith("ddtree_") and not s.startswith("_init")
                 and not s.startswith("_fini")]
        assert not stray, f"libddtree exports non-ABI symbols: {stray[:10]}"

    # Kernels of the ops listed in SPILL_FREE must not spill registers to local memory (their hot loops
    # are written to live in registers); the report for every kernel is in the build log.
    spills = [f"{kernel} ({arch}): {line.strip()}" for kernel, arch, line in _spill_reports(log)
              if any(op in kernel for op in SPILL_FREE)]
    assert not spills, "register spills:\n" + "\n".join(spills)

    # The fa3 tree-attention kernel depends on asynchronous wgmma and on setmaxnreg: ptxas must neither
    # serialize the former (C7510/C7512) nor ignore the latter (C7508).
    lost = [line.strip() for line in log.splitlines() if re.search(r"\(C75(08|1\d)\)", line) and "fa3" in line]
    assert not lost, "ptxas performance warnings for tree_attention_fa3_kernel:\n" + "\n".join(lost)


# Ops whose kernels are checked for spills (name fragments of their mangled kernel names).
SPILL_FREE = ("draft_topk", "tree_accept", "kv_commit", "round_update", "commit_update", "tree_attention_fa3")


def _spill_reports(log: str) -> list[tuple[str, str, str]]:
    """(kernel, arch, line) for each ptxas report that shows a spill."""
    out = []
    kernel, arch = "?", "?"
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'", line)
        if m:
            kernel, arch = m.group(1), m.group(2)
        elif re.search(r"[1-9]\d* bytes spill (stores|loads)", line):
            out.append((kernel, arch, line))
    return out


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_public_header_is_plain_c_and_cxx(tmp_path: Path, lang: str) -> None:
    """include/ddtree/ddtree.h (every op's C ABI) compiles as C and as C++: hosts link it from either."""
    nvcc = _nvcc()
    compiler = shutil.which("gcc" if lang == "c" else "g++")
    if nvcc is None or compiler is None:
        pytest.skip("needs nvcc (for the CUDA headers) and gcc/g++")
    roots = [os.environ.get("CUDA_HOME", ""), str(Path(nvcc).resolve().parents[1]), "/usr/local/cuda"]
    found = [Path(r) / "include" for r in roots if r and (Path(r) / "include" / "cuda_runtime.h").is_file()]
    assert found, f"no cuda_runtime.h under {roots}"
    cuda_include = found[0]
    src = tmp_path / "abi.c"
    src.write_text('#include "ddtree/ddtree.h"\nint main(void) { return ddtree_last_error() == 0; }\n')
    _run([compiler, "-x", lang, "-std=c11" if lang == "c" else "-std=c++17", "-Wall", "-Werror", "-fsyntax-only",
          f"-I{ENGINE / 'include'}", f"-I{cuda_include}", str(src)], dict(os.environ))
