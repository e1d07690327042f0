"""The model's fast path (exact=False) on the CPU: same function as the exact path within its dtype's error,
fused weights, no fp64 anywhere; the budget-0 engine skips the drafter; the drafter's fast path and the
batched distillation. The exact path itself is covered (unchanged) by test_model.py and the lossless tests."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ddtree_engine.backend import reference_backend  # noqa: E402
from ddtree_engine.decode import DDTreeEngine, Request, ar_generate  # noqa: E402
from ddtree_engine.drafter import TinyDrafter, distill_drafter_batched  # noqa: E402
from ddtree_engine.model import DenseKV, ModelConfig, TinyTransformer, random_weights  # noqa: E402

from chunked_prefill import chunked_tree_logits  # noqa: E402

CFG = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _tree_logits(model: TinyTransformer, prompt: torch.Tensor, chunk: int) -> torch.Tensor:
    logits, hiddens = chunked_tree_logits(model, prompt, chunk, page=7, backend=reference_backend(), table_row=2)
    assert logits.dtype == torch.float32 and all(h.dtype == model.act_dtype for h in hiddens)
    return logits


def test_fast_fp32_is_the_exact_function() -> None:
    """fp32 fast path (fused GEMMs, torch rms_norm, fp32 RoPE tables, addmm residuals) = the exact path's
    function: dense logits within fp32 rounding, and its tree path (chunked, paged) gives the same argmax."""
    w = random_weights(CFG, 0)
    exact, fast = TinyTransformer(CFG, w), TinyTransformer(CFG, w, exact=False)
    prompt = torch.randint(0, CFG.vocab_size, (90,), generator=torch.Generator().manual_seed(1))
    ref, ref_h = exact.forward_dense(prompt, DenseKV())
    dense, dense_h = fast.forward_dense(prompt, DenseKV())
    assert dense.dtype == torch.float32 and dense.shape == ref.shape
    assert _rel(dense, ref) < 1e-5 and _rel(dense_h, ref_h) < 1e-5
    tree = _tree_logits(fast, prompt, 37)
    assert _rel(tree, ref) < 1e-5
    assert torch.equal(tree.argmax(-1), dense.argmax(-1))


def test_fast_bf16_is_close_to_the_exact_function() -> None:
    """bf16 weights and activations: within bf16's error of the exact model on the same (bf16-rounded)
    weights; the fused matrices hold exactly the rounded originals."""
    w = {k: v.to(torch.bfloat16).float() for k, v in random_weights(CFG, 2).items()}
    exact = TinyTransformer(CFG, w)
    fast = TinyTransformer(CFG, w, exact=False, act_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    f0 = fast.f["layers.0.wqkv"]
    assert f0.dtype == torch.bfloat16
    assert torch.equal(f0.float(), torch.cat([w["layers.0.wq"], w["layers.0.wk"], w["layers.0.wv"]]))
    assert torch.equal(fast.f["layers.1.w_gu"].float(), torch.cat([w["layers.1.w_gate"], w["layers.1.w_up"]]))
    prompt = torch.randint(0, CFG.vocab_size, (64,), generator=torch.Generator().manual_seed(3))
    ref, _ = exact.forward_dense(prompt, DenseKV())
    tree = _tree_logits(fast, prompt, 64)
    assert _rel(tree, ref) < 3e-2
    assert (tree.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8
    expect = sum(t.numel() for k, t in fast.f.items() if k != "embed") * 2
    assert fast.fast_weight_bytes() == expect


class _DtypeLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[torch.dtype] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.add(t.dtype)
        return out


def test_fast_forward_has_no_fp64() -> None:
    """No op of the fast tree forward produces an fp64 tensor (the exact path does, by design)."""
    fast = TinyTransformer.random(CFG, seed=1, exact=False, act_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    prompt = torch.randint(0, CFG.vocab_size, (20,), generator=torch.Generator().manual_seed(4))
    log = _DtypeLog()
    with log:
        _tree_logits(fast, prompt, 20)
    assert torch.float64 not in log.seen and torch.bfloat16 in log.seen
    exact = TinyTransformer.random(CFG, seed=1)
    log2 = _DtypeLog()
    with log2:
        _tree_logits(exact, prompt, 20)
    assert torch.float64 in log2.seen  # the check above can see fp64 when it is there


def test_fast_rope_equals_exact_rope() -> None:
    """The fp32 angle pos * inv_freq carries ~pos * 2^-24 rad of rounding (as in HF's fp32 RoPE): at
    positions < 4096 and |x| ~ 3 that is < 1e-3 absolute; the fp64 exact rope is the reference."""
    w = random_weights(CFG, 0)
    exact, fast = TinyTransformer(CFG, w), TinyTransformer(CFG, w, exact=False)
    x = torch.randn(50, 6, CFG.head_dim, generator=torch.Generator().manual_seed(5))
    pos = torch.randint(0, 4096, (50,), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(fast._fast_rope(x, fast._rope_tables(pos)), exact.rope(x, pos), rtol=0, atol=1e-3)


class _NoDrafter:
    block_len = 5

    def draft(self, *_a: object) -> torch.Tensor:
        raise AssertionError("a budget-0 engine must not call the drafter")


def test_budget0_engine_skips_the_drafter_and_equals_ar() -> None:
    model = TinyTransformer.random(CFG, seed=0)
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6]]
    eng = DDTreeEngine(model, _NoDrafter(), reference_backend(), slots=3, max_budget=0, max_context=64)
    gens = eng.generate([Request(p, 24) for p in prompts])
    assert [g.tokens for g in gens] == [ar_generate(model, p, 24) for p in prompts]


def test_fast_drafter_shapes_and_batched_distillation() -> None:
    """TinyDrafter on a fast bf16 target: logits [B, L, V] in bf16 from the shared lm_head; the batched
    distillation (one budget-0 engine over all prompts) trains the fp32 masters, refreshes the bf16 copies
    and reports held-out agreement per depth over whole held-out sequences."""
    model = TinyTransformer.random(CFG, seed=0, exact=False, act_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    dr = TinyDrafter(model, block_len=4, seed=1, ffn_dim=64)
    assert dr.lm_head is model.f["lm_head"]
    root = torch.tensor([1, 2, 3], dtype=torch.int32)
    hidden = torch.randn(3, CFG.d_model, dtype=torch.bfloat16)
    out = dr.draft(root, hidden, root)
    assert out.shape == (3, 4, CFG.vocab_size) and out.dtype == torch.bfloat16
    before = dr.run_w["w1"].clone()
    res = distill_drafter_batched(model, dr, reference_backend(), sequences=8, tokens=20, steps=3, batch=8)
    assert [k for k in res if k.startswith("depth")] == ["depth1", "depth2", "depth3", "depth4"]
    assert all(0.0 <= res[f"depth{i}"] <= 1.0 for i in range(1, 5))
    assert res["samples"] == 7 * (20 - 4)  # 8 prompts, 1 held out; rounds with 4 known successors
    assert not torch.equal(dr.run_w["w1"], before)
    assert all(not p.requires_grad for p in dr.trainable())


def test_random_weights_on_a_device_dtype() -> None:
    w = random_weights(CFG, 7, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in w.values())
    assert torch.equal(random_weights(CFG, 7)["embed"], random_weights(CFG, 7)["embed"])


def test_unfused_fast_mode_stays_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDTREE_MODEL_FAST=0 keeps the pre-session-9 fast mode (unfused, the exact path's functions in act_dtype)
    for A/B runs: no fused weights, the same function within fp32 rounding, and its drafter on the fp32 path."""
    w = random_weights(CFG, 0)
    monkeypatch.setenv("DDTREE_MODEL_FAST", "0")
    old = TinyTransformer(CFG, w, exact=False)
    monkeypatch.delenv("DDTREE_MODEL_FAST")
    new = TinyTransformer(CFG, w, exact=False)
    assert not old.fast and new.fast and not hasattr(old, "f")
    prompt = torch.randint(0, CFG.vocab_size, (40,), generator=torch.Generator().manual_seed(8))
    assert _rel(_tree_logits(old, prompt, 40), _tree_logits(new, prompt, 40)) < 1e-5
    assert old.fast_weight_bytes() == new.fast_weight_bytes()
    assert not TinyDrafter(old, block_len=3).fast and TinyDrafter(new, block_len=3).fast


@pytest.mark.parametrize("rows", [1, 7, 8, 12, 16, 17, 40])
def test_gemm_operand_swapped_rows_are_the_same_product(rows: int) -> None:
    """`gemm` runs fp32 products of 8-16 rows as (w a^T)^T (a cuBLAS kernel choice, model.gemm says why):
    the same function as linear / addmm at every row count, contiguous [M, N], with and without the residual,
    and with the same gradients (the fast drafter trains through it)."""
    from ddtree_engine.model import SLOW_FP32_GEMM_ROWS, gemm

    g = torch.Generator().manual_seed(rows)
    a = torch.randn(rows, 48, generator=g, requires_grad=True)
    w = torch.randn(80, 48, generator=g, requires_grad=True)
    r = torch.randn(rows, 80, generator=g)
    ref = torch.nn.functional.linear(a, w)
    out = gemm(a, w)
    assert out.shape == (rows, 80) and out.is_contiguous()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)
    res = gemm(a, w, residual=r)
    assert res.is_contiguous()
    torch.testing.assert_close(res, r + ref, rtol=1e-6, atol=1e-5)
    (ga, gw) = torch.autograd.grad((res * r).sum(), (a, w))
    (ra, rw) = torch.autograd.grad(((r + ref) * r).sum(), (a, w))
    torch.testing.assert_close(ga, ra, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-4)
    # bf16 and out-of-range row counts keep the plain GEMM; 8-16 fp32 rows take the swapped form.
    lo, hi = SLOW_FP32_GEMM_ROWS
    swapped = lo <= rows <= hi
    with torch.autograd.profiler.profile() as prof:
        gemm(a.detach(), w.detach())
    names = {e.name for e in prof.function_events}
    assert ("aten::mm" in names and "aten::linear" not in names) if swapped else ("aten::linear" in names)


def test_fast_bf16_logits_dtype_is_the_lm_head_gemms_own_output() -> None:
    """logits_dtype=act_dtype: bf16 logits straight out of the lm_head GEMM, the values the fp32 setting casts on
    the CPU (there torch has no bf16 x bf16 -> fp32 GEMM, so that path is the bf16 GEMM + a cast); the hidden state is
    untouched; any other dtype, or bf16 logits on the exact path, is refused. Settable between forwards."""
    w = random_weights(CFG, 0)
    f32 = TinyTransformer(CFG, w, exact=False, act_dtype=torch.bfloat16)
    b16 = TinyTransformer(CFG, w, exact=False, act_dtype=torch.bfloat16, logits_dtype=torch.bfloat16)
    prompt = torch.randint(0, CFG.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    a, ha = f32.forward_dense(prompt, DenseKV())
    b, hb = b16.forward_dense(prompt, DenseKV())
    assert a.dtype == torch.float32 and b.dtype == torch.bfloat16 and torch.equal(ha, hb)
    assert torch.equal(b.float(), a)
    f32.logits_dtype = torch.bfloat16
    assert torch.equal(f32.forward_dense(prompt, DenseKV())[0], b)
    with pytest.raises(ValueError, match="logits_dtype"):
        TinyTransformer(CFG, w, exact=False, act_dtype=torch.bfloat16, logits_dtype=torch.float16)
    with pytest.raises(ValueError, match="logits_dtype"):
        TinyTransformer(CFG, w, logits_dtype=torch.bfloat16)
