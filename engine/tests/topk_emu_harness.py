"""Shared by the CPU emulation tests of the draft_topk_lse kernels (test_draft_topk_lse_v3_emu.py,
test_draft_topk_lse_v4_emu.py): build an emulator binary from tests/topk_emu/, feed it logits, read
its outputs and event counters, and compare them with the reference at the GPU tests' tolerances.

Protocol of every emulator binary: stdin = one header line "rows vocab k is_bf16 [extra ...]" then the
logits as little-endian fp32; stdout = one line per row "lse | lp ... | id ..." (floats in hex);
stderr = a tag then name=value event counters."""

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


def build_emulator(tmp_path_factory: pytest.TempPathFactory, source: str, fake_cuda: str,
                   defines: tuple[str, ...] = ()) -> Path:
    """g++ build of tests/topk_emu/<source> against the fake CUDA headers in tests/topk_emu/<fake_cuda>,
    with extra preprocessor definitions ("NAME=VALUE")."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the CPU emulation of the kernel needs a C++20 compiler")
    out = tmp_path_factory.mktemp(Path(source).stem) / Path(source).stem
    cmd = [gxx, "-std=c++20", "-O2", "-pthread", f"-I{ENGINE / 'include'}", f"-I{EMU / fake_cuda}",
           *(f"-D{d}" for d in defines), str(EMU / source), "-o", str(out)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return out


def run_emulator(binary: Path, x: torch.Tensor, k: int, extra: tuple[int, ...] = ()
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int]]:
    """(top_lp, top_id, lse, events) of the emulated kernel(s) on logits x [B, L, V] (fp32 or bf16);
    `extra` goes to the end of the header line (the v4 emulator's threads and exchange)."""
    batch, positions, vocab = x.shape
    fields = (batch * positions, vocab, k, 1 if x.dtype == torch.bfloat16 else 0, *extra)
    payload = (" ".join(map(str, fields)) + "\n").encode() + x.float().contiguous().numpy().astype("<f4").tobytes()
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


def compare_with_reference(binary: Path, x: torch.Tensor, k: int, extra: tuple[int, ...] = ()) -> dict[str, int]:
    """Emulated outputs against the reference: ids exactly, log-probs and lse within the GPU tests'
    tolerances, the same NaN/inf pattern. Returns the emulator's event counters."""
    lp, ids, lse, events = run_emulator(binary, x, k, extra)
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
