"""qkv_prep: the reference against a per-element hand computation (CPU, CI), the CUDA op against the reference
bit for bit (GPU: the same fp32 operations, each rounded), bad arguments, and the model's fast path with the op
against its torch sequence (test_fused_rope_is_within_one_rounding_of_the_torch_sequence states their exact
relation)."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_engine.reference import qkv_prep as ref_qkv_prep

_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def needs_cuda(test):  # type: ignore[no-untyped-def]
    """Marked `gpu` (what the device runs select with -m gpu) and skipped without CUDA."""
    return pytest.mark.gpu(_skip_without_cuda(test))


def _tables(pos: torch.Tensor, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [T, D] and sign-folded sin [T, D], as TinyTransformer._rope_tables builds them."""
    half = d // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32, device=pos.device) / half))
    ang = pos.float()[:, None] * inv[None]
    return (torch.cat([ang.cos(), ang.cos()], -1).to(dtype).contiguous(),
            torch.cat([-ang.sin(), ang.sin()], -1).to(dtype).contiguous())


def _case(t: int, hq: int, hkv: int, d: int, page: int, pages: int, dtype: torch.dtype, device: str, seed: int
          ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).to(dtype).to(device)
    pos = torch.randint(0, 5000, (t,), generator=g).to(device)
    cos, sin = _tables(pos, d, dtype)
    # Distinct slots scattered over shuffled pages (a token's page is rarely its neighbour's).
    slots = torch.randperm(pages * page, generator=g)[:t].to(device)
    k = torch.randn(pages, page, hkv, d, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(pages, page, hkv, d, generator=g).to(torch.bfloat16).to(device)
    return qkv, cos, sin, slots, k, v


def test_reference_is_the_per_element_rope() -> None:
    """Each output element is fp32(fp32(x[j] cos[j]) + fp32(x[j ^ half] sin[j])) rounded to the cache dtype;
    value heads are copied; rows of other slots are untouched; q comes back [T, Hq, D]."""
    t, hq, hkv, d = 5, 4, 2, 8
    qkv, cos, sin, slots, k, v = _case(t, hq, hkv, d, 4, 3, torch.bfloat16, "cpu", 1)
    k0, v0 = k.clone(), v.clone()
    q = ref_qkv_prep(qkv, cos, sin, slots, k, v)
    assert q.shape == (t, hq, d) and q.dtype == torch.bfloat16 and q.is_contiguous()
    x = qkv.float().view(t, -1, d)
    half = d // 2
    kf, vf = k.view(-1, hkv, d), v.view(-1, hkv, d)
    for i in range(t):
        for h in range(hq + hkv):
            for j in range(d):
                a = torch.tensor(x[i, h, j].item() * cos[i, j].float().item(), dtype=torch.float32)
                b = torch.tensor(x[i, h, (j + half) % d].item() * sin[i, j].float().item(), dtype=torch.float32)
                want = (a + b).to(torch.bfloat16)
                got = q[i, h, j] if h < hq else kf[slots[i], h - hq, j]
                assert torch.equal(got, want), (i, h, j)
        assert torch.equal(vf[slots[i]], x[i, hq + hkv:].to(torch.bfloat16))
    written = torch.zeros(kf.shape[0], dtype=torch.bool)
    written[slots] = True
    assert torch.equal(kf[~written], k0.view(-1, hkv, d)[~written])
    assert torch.equal(vf[~written], v0.view(-1, hkv, d)[~written])


def test_reference_skips_out_of_range_slots() -> None:
    qkv, cos, sin, slots, k, v = _case(3, 2, 1, 16, 2, 2, torch.bfloat16, "cpu", 2)
    slots = torch.tensor([1, -1, 4])  # 4 rows in the cache: the last two tokens are outside
    k0 = k.clone()
    ref_qkv_prep(qkv, cos, sin, slots, k, v)
    changed = (k.view(4, -1) != k0.view(4, -1)).any(-1)
    assert changed.tolist() == [False, True, False, False]


@needs_cuda
@pytest.mark.parametrize("t,hq,hkv,d,dtype", [
    (1, 8, 1, 64, torch.bfloat16), (17, 16, 8, 128, torch.bfloat16), (65, 16, 8, 64, torch.bfloat16),
    (131, 8, 1, 128, torch.bfloat16), (7, 8, 1, 64, torch.float32), (33, 16, 8, 128, torch.float32),
])
def test_cuda_op_is_the_reference_bit_for_bit(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype) -> None:
    """Odd T, GQA 8/1 and 16/8, D 64 and 128, bf16 or fp32 GEMM output into bf16 caches, slots over 16-row pages
    (the whole cache compared, so a stray write shows too)."""
    from ddtree_engine.ops import check_errors, qkv_prep

    case = _case(t, hq, hkv, d, 16, math.ceil(2 * t / 16) + 1, dtype, "cuda", t * 7 + d)
    ref = [c.clone() for c in case]
    q = qkv_prep(*case)
    q_ref = ref_qkv_prep(*ref)
    torch.cuda.synchronize()
    check_errors()
    assert torch.equal(q, q_ref) and torch.equal(case[4], ref[4]) and torch.equal(case[5], ref[5])


@needs_cuda
def test_cuda_op_strided_rows_graph_capture_and_bad_slots() -> None:
    """A qkv view with a longer row stride; a replay of a captured call equals the eager call; a slot outside the
    cache skips that token and raises the bad-index flag."""
    from ddtree_engine import _lib
    from ddtree_engine.ops import check_errors, qkv_prep

    qkv, cos, sin, slots, k, v = _case(9, 8, 1, 64, 16, 2, torch.bfloat16, "cuda", 5)
    wide = torch.zeros(9, qkv.shape[1] + 64, dtype=qkv.dtype, device="cuda")
    wide[:, : qkv.shape[1]] = qkv
    k1, v1 = k.clone(), v.clone()
    q1 = qkv_prep(wide[:, : qkv.shape[1]], cos, sin, slots, k1, v1)
    q2 = ref_qkv_prep(qkv, cos, sin, slots, k, v)
    assert torch.equal(q1, q2) and torch.equal(k1, k) and torch.equal(v1, v)
    k.zero_()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        qkv_prep(qkv, cos, sin, slots, k, v)  # warm
    torch.cuda.current_stream().wait_stream(s)
    k.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qg = qkv_prep(qkv, cos, sin, slots, k, v)
    g.replay()
    torch.cuda.synchronize()
    # The replay wrote the tokens' K rows into the zeroed cache and nothing else.
    rows, rows1 = k.view(-1, k.shape[2], k.shape[3]), k1.view(-1, k.shape[2], k.shape[3])
    untouched = torch.ones(rows.shape[0], dtype=torch.bool, device="cuda")
    untouched[slots] = False
    assert torch.equal(qg, q2) and torch.equal(rows[slots], rows1[slots]) and not rows[untouched].any()
    check_errors()
    bad = slots.clone()
    bad[3] = k.shape[0] * k.shape[1]
    before = k.clone()
    qkv_prep(qkv, cos, sin, bad, k, v)
    with pytest.raises(_lib.DdtreeDeviceError):
        check_errors()
    assert torch.equal(k.view(-1, 1, 64)[bad[:3]], before.view(-1, 1, 64)[bad[:3]])


@needs_cuda
def test_cuda_op_rejects_bad_arguments() -> None:
    from ddtree_engine import _lib
    from ddtree_engine.ops import qkv_prep

    qkv, cos, sin, slots, k, v = _case(4, 8, 1, 64, 16, 1, torch.bfloat16, "cuda", 6)
    with pytest.raises(ValueError):
        qkv_prep(qkv, cos, sin, slots.int(), k, v)  # slots must be int64
    with pytest.raises(ValueError):
        qkv_prep(qkv, cos.float(), sin, slots, k, v)  # tables in qkv's dtype
    with pytest.raises(ValueError):
        qkv_prep(qkv[:, : 2 * 64], cos, sin, slots, k, v)  # no query head left
    with pytest.raises(ValueError):
        qkv_prep(qkv.cpu(), cos, sin, slots, k, v)
    with pytest.raises(_lib.DdtreeError):  # head_dim 8 is below the bf16 vector pair (the C ABI says why)
        a = torch.zeros(4, 10 * 8, dtype=torch.bfloat16, device="cuda")
        c = torch.zeros(4, 8, dtype=torch.bfloat16, device="cuda")
        kc = torch.zeros(1, 16, 1, 8, dtype=torch.bfloat16, device="cuda")
        qkv_prep(a, c, c, slots, kc, kc.clone())
    with pytest.raises(_lib.DdtreeError):  # a row start that is not 16-byte aligned
        qkv_prep(qkv[:, 1:].contiguous()[:, : qkv.shape[1] - 64], cos, sin, slots, k, v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_rope_is_within_one_rounding_of_the_torch_sequence(dtype: torch.dtype) -> None:
    """The exact relation between the fast path's two sequences. torch: a' = act(x cos) (rounded to the GEMM's dtype
    by the mul), then addcmul(a', swap(x), sin) in fp32 and one rounding to the output dtype; qkv_prep: fp32(x cos)
    + fp32(swap(x) sin) in fp32, one rounding. x cos and swap(x) sin are exact in fp32 for bf16 inputs, so per
    element |fused - torch| <= u (|x cos| + |fused| + |torch|) with u = 2^-8 (bf16's unit roundoff; the fp32 terms
    are ~2^-16 of that, covered by the 1.01). Value heads are the same bits."""
    from ddtree_engine.model import ModelConfig, TinyTransformer

    cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=1, n_heads=8, n_kv_heads=1, head_dim=64, ffn_dim=64)
    m = TinyTransformer.random(cfg, 0, exact=False, act_dtype=dtype, kv_dtype=torch.bfloat16)
    t = 23
    qkv, _, _, slots, k, v = _case(t, 8, 1, 64, 16, 2, dtype, "cpu", 9)
    cos, sin = m._rope_tables(torch.randint(0, 4000, (t,), generator=torch.Generator().manual_seed(3)))
    q = ref_qkv_prep(qkv, cos, sin, slots, k, v)
    fused = torch.cat([q.float(), k.view(-1, 1, 64)[slots].float()], 1)
    x = qkv.view(t, 10, 64)
    old = m._fast_rope(x[:, :9], (cos, sin)).to(torch.bfloat16).float()
    xc = (x[:, :9].float() * cos.float()).abs()
    bound = 2.0**-8 * (xc + fused.abs() + old.abs()) * 1.01
    assert bool(((fused - old).abs() <= bound).all())
    assert int((fused != old).sum()) < fused.numel() // 4  # mostly the same bits (a test that can fail both ways)
    assert torch.equal(v.view(-1, 1, 64)[slots], x[:, 9:].to(torch.bfloat16))


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float32])
def test_model_fast_forward_with_and_without_qkv_prep(act: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's fast forward (bf16 K/V) through the reference backend, qkv_prep on (the default) and off
    (DDTREE_QKV_PREP=0's attribute): layer 0's V rows are the same bits, K rows within the bound above, logits
    within bf16's error of each other."""
    from ddtree_engine.backend import reference_backend
    from ddtree_engine.decode import chain_anc
    from ddtree_engine.model import ModelConfig, TinyTransformer
    from ddtree_engine.paged_kv import PagedKVCache

    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96)
    monkeypatch.setenv("DDTREE_QKV_PREP", "0")
    m = TinyTransformer.random(cfg, 4, exact=False, act_dtype=act, kv_dtype=torch.bfloat16)
    assert not m.qkv_prep and m._fused_qkv_prep(reference_backend()) is None  # DDTREE_QKV_PREP=0: torch sequence
    monkeypatch.delenv("DDTREE_QKV_PREP")
    m = TinyTransformer.random(cfg, 4, exact=False, act_dtype=act, kv_dtype=torch.bfloat16)
    assert m.qkv_prep and m._fused_qkv_prep(reference_backend()) is not None  # the default
    b, n = 2, 9
    tokens = torch.randint(0, cfg.vocab_size, (b, n), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    ctx = torch.tensor([5, 20], dtype=torch.int32)
    pos = (ctx[:, None] + torch.arange(n, dtype=torch.int32)[None]).contiguous()
    anc = chain_anc(n, "cpu").expand(b, -1, -1).contiguous()
    out = {}
    for on in (True, False):
        cache = PagedKVCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, slots=b,
                             max_slot_tokens=40, dtype=torch.bfloat16, device="cpu")
        m.qkv_prep = on
        logits, _ = m.forward_tree(reference_backend(), cache.k, cache.v, cache.block_table, tokens, pos, ctx, anc)
        out[on] = (logits, cache.k[0].clone(), cache.v[0].clone())
    assert torch.equal(out[True][2], out[False][2])
    kd = (out[True][1].float() - out[False][1].float()).abs()
    assert float(kd.max()) <= 2.0**-6 * float(out[False][1].float().abs().max())
    rel = float((out[True][0] - out[False][0]).norm() / out[False][0].norm())
    assert 0 < rel < 2e-2 if act == torch.bfloat16 else rel < 2e-2
