"""DDTree decoding on CUDA with the libddtree kernels (`python3 -m pytest engine/tests -m gpu`).

* Exact lossless: the four integer/selection kernels (draft_topk_lse, build_tree, tree_accept, kv_commit)
  from libddtree; attention through the PyTorch reference on the GPU (the tree-attention kernel takes
  bf16 only, and bf16 attention cannot be bit-reproducible across tree and AR shapes); model in exact
  mode (fp64 accumulation rounded to fp32). Greedy and sampled DDTree == AR token for token.
* Full kernels: all five kernels, bf16 K/V, one round captured as a CUDA graph. Graph replay == eager
  token for token; the agreement of DDTree with budget-0 decoding on the same kernels is printed, not
  asserted (bf16 attention rounds differently for different tree shapes, so exact equality is not a
  property of this configuration).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from ddtree_engine.backend import cuda_backend, mixed_backend  # noqa: E402
from ddtree_engine.decode import DDTreeEngine, Request, ar_generate  # noqa: E402
from ddtree_engine.drafter import NoisyOracleDrafter, TinyDrafter  # noqa: E402
from ddtree_engine.model import DenseKV, ModelConfig, TinyTransformer  # noqa: E402

CFG = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176)
L, N_TOKENS, MAX_CONTEXT = 7, 256, 320
LENGTHS = [1, 2, 5, 16, 17, 33, 40, 9, 3, 24, 31, 12, 1, 48, 7, 20]


def _prompts(seed: int = 9) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CFG.vocab_size, (k,), generator=g).tolist() for k in LENGTHS]


@pytest.fixture(scope="module")
def exact_model() -> TinyTransformer:
    return TinyTransformer.random(CFG, seed=0, device="cuda")


@pytest.fixture(scope="module")
def exact_backend() -> Any:
    from ddtree_engine.reference.tree_attention import tree_attention

    return mixed_backend("cuda+ref-attention", cuda_backend(), tree_attention=tree_attention)


@pytest.fixture(scope="module")
def greedy_ref(exact_model: TinyTransformer) -> list[list[int]]:
    return [ar_generate(exact_model, p, N_TOKENS) for p in _prompts()]


def _noisy(slots: int, refs: dict[int, list[int]], agree: float = 0.6) -> tuple[Any, Any]:
    drafter = NoisyOracleDrafter(CFG.vocab_size, L, slots, MAX_CONTEXT + L + 2, "cuda", agree=agree)
    return drafter, lambda slot, idx: drafter.set_reference(slot, refs[idx])


@pytest.mark.parametrize("budget,batch", [(0, 8), (1, 8), (2, 8), (7, 8), (15, 8), (64, 8), (64, 3), (15, 1)])
def test_gpu_greedy_lossless(exact_model: TinyTransformer, exact_backend: Any, greedy_ref: list[list[int]],
                             budget: int, batch: int) -> None:
    prompts = _prompts()
    pick = list(range(16)) if batch == 8 else list(range(batch * 2))
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    drafter, on_admit = _noisy(batch, refs)
    eng = DDTreeEngine(exact_model, drafter, exact_backend, slots=batch, max_budget=budget,
                       max_context=MAX_CONTEXT)
    gens = eng.generate([Request(prompts[i], N_TOKENS, budget=budget) for i in pick], on_admit=on_admit)
    for k, i in enumerate(pick):
        assert gens[k].tokens == greedy_ref[i]
    lens = [a for g in gens for a in g.accept_lens]
    print(f"GPU budget={budget} batch={batch}: mean accept {sum(lens) / len(lens):.2f}")


def test_gpu_sampled_lossless(exact_model: TinyTransformer, exact_backend: Any) -> None:
    prompts = _prompts()[:6]
    ref = [ar_generate(exact_model, p, N_TOKENS, temperature=0.9, seed=77 + k, request=k)
           for k, p in enumerate(prompts)]
    drafter, on_admit = _noisy(6, {k: p + r for k, (p, r) in enumerate(zip(prompts, ref))})
    eng = DDTreeEngine(exact_model, drafter, exact_backend, slots=6, max_budget=32, max_context=MAX_CONTEXT)
    gens = eng.generate([Request(p, N_TOKENS, budget=32, temperature=0.9, seed=77 + k)
                         for k, p in enumerate(prompts)], on_admit=on_admit)
    assert [g.tokens for g in gens] == ref


def test_gpu_tree_path_matches_dense_path(exact_model: TinyTransformer, exact_backend: Any) -> None:
    from ddtree_engine.decode import chain_anc
    from ddtree_engine.paged_kv import PagedKVCache

    prompt = torch.tensor(_prompts()[13], device="cuda")
    dense, _ = exact_model.forward_dense(prompt, DenseKV())
    cache = PagedKVCache(n_layers=2, n_kv_heads=2, head_dim=16, slots=2, max_slot_tokens=64,
                         dtype=exact_model.kv_dtype, device="cuda")
    ctx = torch.zeros(1, dtype=torch.int32, device="cuda")
    n = prompt.shape[0]
    tree, _ = exact_model.forward_tree(exact_backend, cache.k, cache.v, cache.block_table[1:2],
                                       prompt[None].to(torch.int32), torch.arange(n, device="cuda",
                                       dtype=torch.int32)[None], ctx, chain_anc(n, "cuda"))
    assert torch.equal(tree[0].argmax(-1), dense.argmax(-1))
    torch.testing.assert_close(tree[0], dense, rtol=0, atol=2e-5)


# ---- all five kernels, bf16 K/V, CUDA graph ---------------------------------------------------------
# The tree-attention kernel takes head_dim 64/128/256.
FAST_CFG = ModelConfig(vocab_size=320, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=352)


@pytest.fixture(scope="module")
def fast_model() -> TinyTransformer:
    return TinyTransformer.random(FAST_CFG, seed=0, device="cuda", exact=False, kv_dtype=torch.bfloat16)


def _run_fast(model: TinyTransformer, drafter: Any, budget: int, graph: bool, reqs: list[Request],
              on_admit: Any = None) -> list[Any]:
    eng = DDTreeEngine(model, drafter, cuda_backend(), slots=len(reqs), max_budget=budget,
                       max_context=MAX_CONTEXT)
    if graph:
        eng.capture_graph()
    return eng.generate(reqs, on_admit=on_admit)


def test_gpu_cuda_graph_replay_equals_eager(fast_model: TinyTransformer) -> None:
    prompts = _prompts()[:8]
    reqs = [Request(p, 128, budget=32) for p in prompts]
    drafter = TinyDrafter(fast_model, block_len=L, seed=3)
    eager = _run_fast(fast_model, drafter, 32, False, reqs)
    graphed = _run_fast(fast_model, drafter, 32, True, reqs)
    assert [g.tokens for g in graphed] == [g.tokens for g in eager]
    assert [g.accept_lens for g in graphed] == [g.accept_lens for g in eager]
    plain = _run_fast(fast_model, drafter, 0, True, [Request(p, 128, budget=0) for p in prompts])
    same = [next((j for j, (a, b) in enumerate(zip(g.tokens, p.tokens)) if a != b), 128)
            for g, p in zip(graphed, plain)]
    print(f"bf16 kernels: DDTree agrees with budget-0 decoding for the first {same} tokens of 128")


def test_gpu_round_has_no_host_sync(fast_model: TinyTransformer) -> None:
    """A whole round with the kernel backend runs with torch's sync debug mode set to error: no .item(),
    no device-to-host copy, no synchronizing op anywhere in drafter, ops, model or bookkeeping."""
    eng = DDTreeEngine(fast_model, TinyDrafter(fast_model, block_len=L), cuda_backend(), slots=3,
                       max_budget=32, max_context=MAX_CONTEXT)
    for slot, p in enumerate(_prompts()[:3]):
        eng.admit(slot, Request(p, 64, budget=32))
    eng.run_round()  # first call: lazy library load and workspace allocation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            eng.run_round()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out = eng.read_round()
    assert set(out.new_tokens) == {0, 1, 2}


# ---- the round's tail in one launch (round_finish) vs the three launches ------------------------------
@pytest.mark.parametrize("budget,batch", [(15, 3), (2, 1)])
def test_gpu_fused_round_tail_is_lossless_and_equals_split(exact_model: TinyTransformer, exact_backend: Any,
                                                            greedy_ref: list[list[int]], budget: int, batch: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact-mode engine takes the fused tail by default (so the lossless tests above run it); with
    DDTREE_ROUND_FINISH=split it takes the three launches; both reproduce greedy AR token for token."""
    prompts = _prompts()
    pick = list(range(batch * 2))
    refs = {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}
    # split: commit_update (one launch, live budget) by default, the two ops and the mask under =ops
    for mode, tail, fused in (("", "", True), ("split", "", False), ("split", "ops", False)):
        monkeypatch.setenv("DDTREE_ROUND_FINISH", mode)
        monkeypatch.setenv("DDTREE_SPLIT_TAIL", tail)
        drafter, on_admit = _noisy(batch, refs)
        eng = DDTreeEngine(exact_model, drafter, exact_backend, slots=batch, max_budget=budget,
                           max_context=MAX_CONTEXT)
        assert eng.fused_finish is fused and eng.commit_update is (mode == "split" and tail == "")
        gens = eng.generate([Request(prompts[i], N_TOKENS, budget=budget) for i in pick], on_admit=on_admit)
        assert [g.tokens for g in gens] == [greedy_ref[i] for i in pick]


def test_gpu_fused_round_tail_stops_mid_tree(exact_model: TinyTransformer, exact_backend: Any,
                                             greedy_ref: list[list[int]]) -> None:
    """A stop id met inside an accepted path ends the request right after it, through the fused tail."""
    prompts = _prompts()
    pick = [0, 3, 5]
    stop = greedy_ref[3][40]
    want = []
    for i in pick:
        ref = greedy_ref[i]
        want.append(ref[: ref.index(stop) + 1] if stop in ref else ref)
    drafter, on_admit = _noisy(3, {k: prompts[i] + greedy_ref[i] for k, i in enumerate(pick)}, agree=0.9)
    eng = DDTreeEngine(exact_model, drafter, exact_backend, slots=3, max_budget=15, max_context=MAX_CONTEXT,
                       stop_ids=[stop])
    assert eng.fused_finish
    gens = eng.generate([Request(prompts[i], N_TOKENS, budget=15) for i in pick], on_admit=on_admit)
    assert [g.tokens for g in gens] == want
    assert gens[1].finish_reason == "stop"


def test_gpu_fused_round_tail_graph_equals_split_graph(fast_model: TinyTransformer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """All five kernels under CUDA graphs: the fused tail and the three launches give the same tokens and
    the same acceptance, round by round (sampled and greedy requests mixed, budgets 0..32 in one batch)."""
    prompts = _prompts()[:8]
    reqs = [Request(p, 96, budget=[0, 1, 7, 32][k % 4], temperature=0.8 if k % 3 == 0 else 0.0, seed=k)
            for k, p in enumerate(prompts)]
    drafter = TinyDrafter(fast_model, block_len=L, seed=3)
    runs = []
    for mode, tail in (("fused", ""), ("split", ""), ("split", "ops")):  # split "": commit_update
        monkeypatch.setenv("DDTREE_ROUND_FINISH", mode)
        monkeypatch.setenv("DDTREE_SPLIT_TAIL", tail)
        runs.append(_run_fast(fast_model, drafter, 32, True, reqs))
    for run in runs[1:]:
        assert [g.tokens for g in run] == [g.tokens for g in runs[0]]
        assert [g.accept_lens for g in run] == [g.accept_lens for g in runs[0]]


# ---- the bf16 fast path (weights and activations in bf16, fused GEMMs): the realistic presets' model ----------
BF16_CFG = ModelConfig(vocab_size=997, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)


@pytest.fixture(scope="module")
def bf16_pair() -> tuple[TinyTransformer, TinyTransformer]:
    """(exact fp64-accumulating model, bf16 fast model) on the same bf16-rounded weights."""
    from ddtree_engine.model import random_weights

    w = {k: v.to(torch.bfloat16).float() for k, v in random_weights(BF16_CFG, 5).items()}
    return (TinyTransformer(BF16_CFG, w, device="cuda"),
            TinyTransformer(BF16_CFG, w, device="cuda", exact=False, act_dtype=torch.bfloat16,
                            kv_dtype=torch.bfloat16))


def test_gpu_bf16_fast_forward_matches_exact(bf16_pair: tuple[TinyTransformer, TinyTransformer]) -> None:
    """The bf16 fast forward through the CUDA tree-attention kernel (prefill chain, paged) computes the exact
    model's function within bf16 error; logits fp32 (out of the lm_head GEMM), hidden bf16."""
    from ddtree_engine.decode import chain_anc
    from ddtree_engine.paged_kv import PagedKVCache

    exact, fast = bf16_pair
    prompt = torch.randint(0, BF16_CFG.vocab_size, (80,), generator=torch.Generator().manual_seed(2)).cuda()
    ref, _ = exact.forward_dense(prompt, DenseKV())
    cache = PagedKVCache(n_layers=2, n_kv_heads=2, head_dim=64, slots=2, max_slot_tokens=96,
                         dtype=torch.bfloat16, device="cuda")
    ctx = torch.zeros(1, dtype=torch.int32, device="cuda")
    logits, hid = fast.forward_tree(cuda_backend(), cache.k, cache.v, cache.block_table[1:2],
                                    prompt[None].to(torch.int32), torch.arange(80, device="cuda",
                                    dtype=torch.int32)[None], ctx, chain_anc(80, "cuda"))
    assert logits.dtype == torch.float32 and hid.dtype == torch.bfloat16
    rel = float((logits[0].double() - ref.double()).norm() / ref.double().norm())
    agree = float((logits[0].argmax(-1) == ref.argmax(-1)).float().mean())
    print(f"bf16 fast vs exact: relative error {rel:.2e}, argmax agreement {agree:.3f}")
    assert rel < 3e-2 and agree > 0.8


def _graph_equals_eager(model: TinyTransformer, drafter: Any, reqs: list[Request], monkeypatch: pytest.MonkeyPatch,
                        on_admit: Any = None) -> None:
    """Graph replay == eager token for token at budget 16, with both round tails."""
    for mode in ("fused", "split"):
        monkeypatch.setenv("DDTREE_ROUND_FINISH", mode)
        eager = _run_fast(model, drafter, 16, False, reqs, on_admit=on_admit)
        graphed = _run_fast(model, drafter, 16, True, reqs, on_admit=on_admit)
        assert [g.tokens for g in graphed] == [g.tokens for g in eager], f"tail {mode}"


def _oracle_accept(model: TinyTransformer, prompts: list[list[int]], plain: list[Any]) -> float:
    """Mean accept length at budget 16 of an oracle drafter built from `plain`, the model's own budget-0 output."""
    from ddtree_engine.drafter import OracleDrafter

    oracle = OracleDrafter(BF16_CFG.vocab_size, L, len(prompts), MAX_CONTEXT + L + 2, "cuda")
    gens = _run_fast(model, oracle, 16, True, [Request(p, 64, budget=16) for p in prompts],
                     on_admit=lambda slot, i: oracle.set_reference(slot, prompts[i] + plain[i].tokens))
    lens = [a for g in gens for a in g.accept_lens]
    return sum(lens) / len(lens)


def test_gpu_bf16_fast_graph_rounds(bf16_pair: tuple[TinyTransformer, TinyTransformer],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 fast model + the distilled TinyDrafter (batched GPU distillation): graph replay == eager token
    for token with both round tails, and an oracle drafter built from budget-0 output accepts > 1 token."""
    from ddtree_engine.drafter import distill_drafter_batched

    _, fast = bf16_pair
    drafter = TinyDrafter(fast, block_len=L, seed=3, ffn_dim=256)
    res = distill_drafter_batched(fast, drafter, cuda_backend(), sequences=32, tokens=64, steps=60, batch=32)
    assert all(0.0 <= res[f"depth{i}"] <= 1.0 for i in range(1, L + 1))
    print("batched distillation, held-out agreement:", " ".join(f"{res[f'depth{i}']:.2f}" for i in range(1, L + 1)))
    prompts = _prompts()[:6]
    reqs = [Request(p, 64, budget=16, temperature=0.7 if k == 4 else 0.0, seed=k) for k, p in enumerate(prompts)]
    _graph_equals_eager(fast, drafter, reqs, monkeypatch)
    plain = _run_fast(fast, drafter, 0, True, [Request(p, 64) for p in prompts])
    accept = _oracle_accept(fast, prompts, plain)
    print(f"bf16 oracle drafter: mean accept {accept:.2f} of {L + 1}")
    assert accept > 2.0


def test_gpu_bf16_logits_rounds(bf16_pair: tuple[TinyTransformer, TinyTransformer],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 model with bf16 target logits (logits_dtype; tree_accept and the round tail read them as they are)
    and a bf16 noisy drafter: graph replay == eager token for token with both round tails (greedy and sampled
    requests); an oracle drafter built from this model's own budget-0 output accepts > 2 tokens per round."""
    from ddtree_engine.drafter import OracleDrafter

    _, fast = bf16_pair
    fast.logits_dtype = torch.bfloat16
    try:
        prompts = _prompts()[:6]
        plain = _run_fast(fast, OracleDrafter(BF16_CFG.vocab_size, L, 6, MAX_CONTEXT + L + 2, "cuda"), 0, True,
                          [Request(p, 64) for p in prompts])
        noisy = NoisyOracleDrafter(BF16_CFG.vocab_size, L, 6, MAX_CONTEXT + L + 2, "cuda", agree=0.8,
                                   dtype=torch.bfloat16)
        assert noisy.draft(torch.zeros(6, dtype=torch.int32, device="cuda"), None,  # type: ignore[arg-type]
                           torch.zeros(6, dtype=torch.int32, device="cuda")).dtype == torch.bfloat16
        reqs = [Request(p, 64, budget=16, temperature=0.7 if k == 4 else 0.0, seed=k) for k, p in enumerate(prompts)]
        _graph_equals_eager(fast, noisy, reqs, monkeypatch,
                            on_admit=lambda slot, i: noisy.set_reference(slot, prompts[i] + plain[i].tokens))
        accept = _oracle_accept(fast, prompts, plain)
        print(f"bf16 logits, oracle drafter: mean accept {accept:.2f} of {L + 1}")
        assert accept > 2.0
    finally:
        fast.logits_dtype = torch.float32
