"""The real draft_topk_lse v3 CUDA kernel source, executed on the CPU, against the reference (CI, no GPU).

tests/topk_emu/ compiles include/ddtree/kernels/draft_topk_lse_v3.cuh with g++ and the SIMT emulator of
tests/build_tree_emu/ (one std::thread per CUDA thread, std::barrier for __syncthreads, per-warp barriers
for shuffles and ballots), runs phase 1 over every (chunk, row) block and then the merge kernel, and
compares with the reference: ids exactly, log-probs and lse within the GPU tests' tolerances. The emulator
uses std::exp for __expf, so it checks the logic (bounds, candidates, ranks, fallbacks, NaN handling),
not the GPU's rounding. The GPU tests (test_draft_topk_lse.py) run the same comparisons on the device."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ddtree_engine.reference import draft_topk_lse as ref_topk
from topk_inputs import make_logits

ENGINE = Path(__file__).resolve().parents[1]
EMU = ENGINE / "tests" / "topk_emu"
INF = float("inf")


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the CPU emulation of the kernel needs a C++20 compiler")
    out = tmp_path_factory.mktemp("topk_emu") / "topk_emu"
    cmd = [gxx, "-std=c++20", "-O2", "-pthread", f"-I{ENGINE / 'include'}", f"-I{EMU / 'fake_cuda'}",
           str(EMU / "topk_emu.cpp"), "-o", str(out)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return out


def run_emu(binary: Path, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int]]:
    """(top_lp, top_id, lse, events) of the emulated kernels on logits x [B, L, V] (fp32 or bf16)."""
    batch, positions, vocab = x.shape
    rows = batch * positions
    header = f"{rows} {vocab} {k} {1 if x.dtype == torch.bfloat16 else 0}\n".encode()
    payload = header + x.float().contiguous().numpy().astype("<f4").tobytes()
    proc = subprocess.run([str(binary)], input=payload, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lse, lp, ids = [], [], []
    for line in proc.stdout.decode().strip().splitlines():
        a, b, c = line.split("|")
        lse.append(float.fromhex(a.strip()))
        lp.append([float.fromhex(t) for t in b.split()])
        ids.append([int(t) for t in c.split()])
    events = {}
    for tok in proc.stderr.decode().split()[1:]:
        name, value = tok.split("=")
        events[name] = int(value)
    return (torch.tensor(lp, dtype=torch.float32).reshape(batch, positions, k),
            torch.tensor(ids, dtype=torch.int32).reshape(batch, positions, k),
            torch.tensor(lse, dtype=torch.float32).reshape(batch, positions), events)


def compare(binary: Path, x: torch.Tensor, k: int) -> dict[str, int]:
    lp, ids, lse, events = run_emu(binary, x, k)
    want_lp, want_ids, want_lse = ref_topk(x, k)
    tol = 4e-6 if x.shape[-1] > 100_000 else 2e-6
    assert torch.equal(ids, want_ids), f"ids differ at {(ids != want_ids).nonzero()[:5].tolist()}"
    assert torch.equal(torch.isnan(lp), torch.isnan(want_lp))
    assert torch.equal(torch.isfinite(lp), torch.isfinite(want_lp))
    assert torch.equal(lp[torch.isinf(want_lp)], want_lp[torch.isinf(want_lp)])
    finite = torch.isfinite(want_lp)
    torch.testing.assert_close(lp[finite], want_lp[finite], atol=tol, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=0, equal_nan=True)
    return events


def logits(shape: tuple[int, int, int], kind: str, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return make_logits(shape, kind, torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("k", [1, 2, 16, 17, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_v3_emulated_random_rows(emu_binary: Path, k: int, dtype: torch.dtype) -> None:
    # 20011 = several chunks with a partial last one (bf16 3, fp32 5). Normal logits take the fast path
    # (warp bound up to k = 16, block bound above) without any radix fallback.
    events = compare(emu_binary, logits((1, 3, 20011), "normal", dtype, seed=k), k)
    assert events.get("merge_radix", 0) == 0 and events.get("partial_radix", 0) == 0


@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 32, 64])
def test_v3_emulated_tie_heavy_rows(emu_binary: Path, kind: str, k: int) -> None:
    events = compare(emu_binary, logits((2, 1, 9000), kind, torch.float32, seed=100 + k), k)
    if kind == "ties" and k > 1:
        assert events.get("partial_radix", 0) > 0  # 4 distinct values: more than 256 candidates per chunk
    compare(emu_binary, logits((1, 2, 997), kind, torch.bfloat16, seed=200 + k), k)


@pytest.mark.parametrize("k", [16, 64])
def test_v3_emulated_full_vocab_row(emu_binary: Path, k: int) -> None:
    events = compare(emu_binary, logits((1, 1, 163840), "normal", torch.bfloat16, seed=5), k)
    assert events.get("partial_radix", 0) == 0


def test_v3_emulated_small_vocab_and_edges(emu_binary: Path) -> None:
    compare(emu_binary, logits((2, 1, 5), "normal", torch.float32, seed=1), 16)  # V < k: padded ranks
    compare(emu_binary, logits((1, 1, 1), "normal", torch.bfloat16, seed=2), 1)
    x = torch.full((1, 2, 5000), -INF)
    x[0, 1, 4321] = 0.5  # one finite logit in a row of -inf
    compare(emu_binary, x, 8)  # row 0 all -inf: lse -inf, lp -inf, ids 0..7


def test_v3_emulated_merge_overflow_takes_radix_path(emu_binary: Path) -> None:
    # 34 fp32 chunks, each holding the values 31..1 once: every chunk's 32nd item is 0 or below, so more
    # than 1024 items clear the merge's bound and the merge falls back to its radix select.
    vocab = 34 * 4096
    x = torch.full((1, 1, vocab), -1.0)
    gen = torch.Generator().manual_seed(9)
    for c in range(34):
        pos = torch.randperm(4096, generator=gen)[:32] + c * 4096
        x[0, 0, pos] = torch.arange(32, dtype=torch.float32)
    events = compare(emu_binary, x, 32)
    assert events.get("merge_radix", 0) == 1


def test_v3_emulated_nan_row(emu_binary: Path) -> None:
    x = logits((1, 3, 9000), "normal", torch.float32, seed=3)
    x[0, 1, 4444] = float("nan")
    x[0, 2, 17] = INF  # +inf is treated like NaN
    lp, ids, lse, events = run_emu(emu_binary, x, 16)
    assert events["flags"] == 1
    for r in (1, 2):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    compare(emu_binary, x[:, :1], 16)
