"""round_finish (tree_accept + kv_commit + round_update in one launch): which backends offer it and when the
decode loop takes it (CPU), and the CUDA op against the reference composition on random rounds, including
graph replay (GPU). The decode-level checks (lossless, fused == split token for token) are in
test_decode_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ddtree_engine.backend import cuda_backend, mixed_backend, reference_backend
from ddtree_engine.reference import round_finish as ref_finish
from ddtree_engine.reference import tree_attention as ref_attention
from ddtree_engine.reference import tree_accept as ref_accept

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---------------------------------------------------------------------------------------------- CPU
def test_only_backends_with_the_three_cuda_ops_offer_the_fused_tail() -> None:
    assert reference_backend().round_finish is None
    cuda = cuda_backend()
    assert cuda.round_finish is not None
    # Replacing attention keeps it (the exact-mode GPU tests run this way); replacing any op it stands for
    # drops it, so a mixed backend never runs a kernel the caller swapped out.
    assert mixed_backend("a", cuda, tree_attention=ref_attention).round_finish is cuda.round_finish
    assert mixed_backend("b", cuda, tree_accept=ref_accept).round_finish is None


def test_decode_mode_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine.decode import DDTreeEngine
    from ddtree_engine.drafter import OracleDrafter
    from ddtree_engine.model import ModelConfig, TinyTransformer

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64)
    model = TinyTransformer.random(cfg, seed=0)

    def engine() -> DDTreeEngine:
        return DDTreeEngine(model, OracleDrafter(64, 3, 2, 64, "cpu"), reference_backend(), slots=2, max_budget=4,
                            max_context=32)

    monkeypatch.setenv("DDTREE_ROUND_FINISH", "fast")
    with pytest.raises(ValueError, match="fused or split"):
        engine()
    monkeypatch.setenv("DDTREE_ROUND_FINISH", "fused")
    with pytest.raises(ValueError, match="no fused round tail"):
        engine()
    monkeypatch.setenv("DDTREE_ROUND_FINISH", "split")
    assert not engine().fused_finish


def test_reference_zeroes_the_live_budget_of_slots_that_stop() -> None:
    """A stop token in the tree finishes slot 0; slot 1 is inactive; slot 2 (no match, bonus 9) decodes on."""
    V, N = 16, 3
    logits = torch.zeros(3, N, V)
    logits[:, 0, 5] = 9.0  # roots' target: 5 (the stop id), but 9 for slot 2
    logits[2, 0, 9] = 20.0
    tokens = torch.tensor([[1, 5, 7], [1, 5, 7], [1, 6, 7]], dtype=torch.int32)
    first = torch.tensor([[1, -1, -1]] * 3, dtype=torch.int32)
    nxt = torch.tensor([[-1, 2, -1]] * 3, dtype=torch.int32)
    i32 = dict(dtype=torch.int32)
    k = [torch.zeros(4, 4, 1, 2)]
    st: dict[str, Any] = dict(
        ctx_len=torch.tensor([2, 2, 2], **i32), hid=torch.randn(3, N, 4), active=torch.tensor([True, False, True]),
        ignore_stop=torch.zeros(3, dtype=torch.bool), max_new=torch.full((3,), 50, **i32),
        out_len=torch.zeros(3, **i32), root=torch.zeros(3, **i32), hidden=torch.zeros(3, 4),
        r_tokens=torch.zeros(3, 4, **i32), r_count=torch.zeros(3, **i32), r_finish=torch.zeros(3, **i32),
    )
    live = torch.tensor([7, 0, 7], **i32)
    ref_finish(logits, tokens, first, nxt, torch.full((3,), N, **i32), st["ctx_len"], torch.zeros(3),
               torch.zeros(3, dtype=torch.int64), torch.tensor([5], **i32), k, [t.clone() for t in k],
               torch.tensor([[0, 1], [2, 3], [1, 0]], **i32), st["hid"], st["active"], st["ignore_stop"],
               st["max_new"], st["out_len"], st["root"], st["hidden"], st["r_tokens"], st["r_count"],
               st["r_finish"], live)
    assert st["active"].tolist() == [False, False, True]
    assert live.tolist() == [0, 0, 7]
    assert st["r_tokens"][0].tolist() == [5, -1, -1, -1]  # the stop id itself is reported
    assert st["ctx_len"].tolist() == [3, 2, 3]


def test_decode_with_a_fused_tail_is_lossless_on_cpu() -> None:
    """The decode loop's fused branch (live budget kept by admit/release and the tail, no mask) with the
    reference round_finish: greedy DDTree == greedy AR, with continuous batching (5 requests, 2 slots),
    mixed budgets (0, 3, 7) and a stop id, so slots finish, are re-admitted and run masked."""
    import dataclasses

    from ddtree_engine.decode import DDTreeEngine, Request, ar_generate
    from ddtree_engine.drafter import NoisyOracleDrafter
    from ddtree_engine.model import ModelConfig, TinyTransformer

    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64)
    model = TinyTransformer.random(cfg, seed=1)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 97, (int(n),), generator=g).tolist() for n in (3, 9, 1, 14, 6)]
    refs = [ar_generate(model, p, 40) for p in prompts]
    stop = refs[1][17]
    want = [r[: r.index(stop) + 1] if stop in r else r for r in refs]
    be = dataclasses.replace(reference_backend(), name="reference+fused-tail", round_finish=ref_finish)
    drafter = NoisyOracleDrafter(97, 4, 2, 128, "cpu", agree=0.7)
    eng = DDTreeEngine(model, drafter, be, slots=2, max_budget=7, max_context=80, stop_ids=[stop])
    assert eng.fused_finish
    gens = eng.generate([Request(p, 40, budget=[0, 3, 7][i % 3]) for i, p in enumerate(prompts)],
                        on_admit=lambda slot, i: drafter.set_reference(slot, prompts[i] + refs[i]))
    assert [x.tokens for x in gens] == want
    assert eng.live_budget.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------- GPU
STATE = ("ctx_len", "active", "out_len", "root", "hidden", "r_tokens", "r_count", "r_finish", "live_budget")


def _round_inputs(batch: int, n_max: int, vocab: int, dtype: torch.dtype, temp: float, layers: int, kv_heads: int,
                  head_dim: int, page: int, kv_dtype: torch.dtype, v_caches: bool, seed: int) -> dict[str, Any]:
    from ddtree_engine.paged_kv import PagedKVCache
    from test_tree_accept import _random_case

    g = torch.Generator().manual_seed(seed)
    args: dict[str, Any] = _random_case(batch, n_max, vocab, dtype, temp, seed)
    args["ctx_len"] = torch.randint(0, 60, (batch,), generator=g, dtype=torch.int32).cuda()
    cache = PagedKVCache(n_layers=layers, n_kv_heads=kv_heads, head_dim=head_dim, slots=batch,
                         max_slot_tokens=200 + n_max, page_size=page, dtype=kv_dtype, device="cuda", seed=seed)
    for c in cache.k + cache.v:
        c.copy_(torch.randn(c.shape, generator=g).to(kv_dtype))
    d = 48
    max_new = torch.randint(1, 30, (batch,), generator=g, dtype=torch.int32)
    i32 = dict(dtype=torch.int32, device="cuda")
    args.update(
        k_caches=cache.k, v_caches=cache.v if v_caches else [], block_table=cache.block_table,
        hid=torch.randn(batch, n_max, d, generator=g).cuda(),
        active=(torch.rand(batch, generator=g) < 0.75).cuda(),
        ignore_stop=(torch.rand(batch, generator=g) < 0.3).cuda(), max_new=max_new.cuda(),
        out_len=(max_new - torch.randint(0, 8, (batch,), generator=g, dtype=torch.int32)).clamp(min=0).cuda(),
        root=torch.randint(0, vocab, (batch,), generator=g, dtype=torch.int32).cuda(),
        hidden=torch.randn(batch, d, generator=g).cuda(), r_tokens=torch.full((batch, 9), 7, **i32),
        r_count=torch.full((batch,), 7, **i32), r_finish=torch.full((batch,), 7, **i32),
        live_budget=torch.randint(1, n_max + 1, (batch,), generator=g, dtype=torch.int32).cuda(),
    )
    return args


# The accept's launch switches (read by the library on every call) for each plan a test names.
ACCEPT_PLANS = {
    "chunked": {"DDTREE_ACCEPT_ONE_CTA": "0"},
    "one_cta": {"DDTREE_ACCEPT_ONE_CTA": "1"},
    "chunked_s6": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "unrolled", "DDTREE_ACCEPT_PDL": "0"},
    "chunked_early": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "compact", "DDTREE_ACCEPT_PDL": "1"},
    # session 12 (s12pdl): the early mode's code launched without PDL (a diagnostic of run_pdl_stress.sh)
    "chunked_early_plain": {"DDTREE_ACCEPT_ONE_CTA": "0", "DDTREE_ACCEPT_SCORE": "compact", "DDTREE_ACCEPT_PDL": "2"},
    "one_cta_compact": {"DDTREE_ACCEPT_ONE_CTA": "1", "DDTREE_ACCEPT_SCORE": "compact"},
}


def _set_accept_plan(monkeypatch: pytest.MonkeyPatch, plan: str) -> None:
    for name, value in ACCEPT_PLANS[plan].items():
        monkeypatch.setenv(name, value)


def _clone(args: dict[str, Any]) -> dict[str, Any]:
    return {k: [t.clone() for t in v] if isinstance(v, list) else v.clone() for k, v in args.items()}


def _assert_same_round(got: dict[str, Any], want: dict[str, Any], out: Any, ref: Any) -> None:
    for name, g, w in zip(out._fields, out, ref):
        assert torch.equal(g, w), f"{name}: {g.tolist()} != {w.tolist()}"
    for name in STATE:
        assert torch.equal(got[name], want[name]), f"{name}: {got[name].tolist()} != {want[name].tolist()}"
    for name in ("k_caches", "v_caches"):
        for layer, (g, w) in enumerate(zip(got[name], want[name])):
            assert torch.equal(g, w), f"{name}[{layer}] differs"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("batch,n_max,vocab,dtype,temp,layers,kv_heads,head_dim,page,kv_dtype,v_caches", [
    (1, 17, 320, torch.float32, 0.0, 2, 2, 64, 16, torch.bfloat16, True),    # the small e2e model
    (8, 65, 320, torch.float32, 0.0, 2, 2, 64, 16, torch.bfloat16, True),
    (3, 24, 997, torch.bfloat16, 0.8, 3, 1, 16, 5, torch.float32, True),     # sampled rows, pages inside trees
    (5, 9, 9000, torch.float32, 0.7, 1, 3, 3, 1, torch.float16, False),      # 2-byte rows: 1-byte units, K only
    (4, 1, 320, torch.float32, 0.0, 2, 2, 64, 16, torch.bfloat16, True),     # budget 0
])
@pytest.mark.parametrize("plan", list(ACCEPT_PLANS))
def test_op_matches_reference(batch: int, n_max: int, vocab: int, dtype: torch.dtype, temp: float, layers: int,
                              kv_heads: int, head_dim: int, page: int, kv_dtype: torch.dtype, v_caches: bool,
                              plan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan: how the accept inside runs (ACCEPT_PLANS: the chunked fused kernel, its one-CTA variant where it fits,
    session 6's scoring, the early mode)."""
    from ddtree_engine.ops import round_finish as op

    _set_accept_plan(monkeypatch, plan)
    for seed in range(3):
        args = _round_inputs(batch, n_max, vocab, dtype, temp, layers, kv_heads, head_dim, page, kv_dtype,
                             v_caches, seed)
        got, want = _clone(args), _clone(args)
        out = op(**got)
        ref = ref_finish(**want)
        torch.cuda.synchronize()
        _assert_same_round(got, want, out, ref)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("plan", list(ACCEPT_PLANS))
def test_op_graph_replay_and_fits(plan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine.ops import check_errors
    from ddtree_engine.ops import round_finish as op
    from ddtree_engine.ops.round_finish import fits

    _set_accept_plan(monkeypatch, plan)
    args = _round_inputs(8, 33, 320, torch.float32, 0.0, 2, 2, 64, 16, torch.bfloat16, True, seed=4)
    args["active"].fill_(True)
    args["max_new"].fill_(1000)
    args["out_len"].zero_()
    want = _clone(args)
    got = _clone(args)
    op(**got)  # warm-up: the library and the arrival counters
    torch.cuda.synchronize()
    got = _clone(args)
    graph = torch.cuda.CUDAGraph()
    static = _clone(args)
    with torch.cuda.graph(graph):
        out = op(**static)
    for _ in range(3):  # each replay is one more round on the advanced state; the reference follows
        ref = ref_finish(**want)
        graph.replay()
        torch.cuda.synchronize()
        _assert_same_round(static, want, out, ref)
    check_errors()
    del got
    k_small = [torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16, device="cuda")] * 2
    k_large = [torch.zeros(2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")] * 16  # ~0.7B model's rows
    assert fits(k_small, k_small, 65) and not fits(k_small, k_small, 1025)
    assert not fits(k_large, k_large, 17)
