"""The small transformer: paged tree path vs dense path, paging, persistence, AR decoding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ddtree_engine.backend import OpBackend  # noqa: E402
from ddtree_engine.decode import ar_generate, chain_anc  # noqa: E402
from ddtree_engine.model import DenseKV, ModelConfig, TinyTransformer, random_weights  # noqa: E402
from ddtree_engine.model_io import load_model, save_model  # noqa: E402

from chunked_prefill import chunked_tree_logits  # noqa: E402

CFG = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176)


def _attention_only_backend() -> OpBackend:
    from ddtree_engine.reference import tree_attention

    def missing(*_a: object, **_k: object) -> None:
        raise AssertionError("not used here")

    return OpBackend("attn-only", missing, missing, tree_attention, missing, missing, missing)


def _prefill_paged(model: TinyTransformer, prompt: torch.Tensor, chunk: int, page: int) -> torch.Tensor:
    return chunked_tree_logits(model, prompt, chunk, page=page, backend=_attention_only_backend(), table_row=1)[0]


@pytest.mark.parametrize("chunk,page", [(37, 16), (100, 7), (1, 16)])
def test_tree_path_matches_dense_path(chunk: int, page: int) -> None:
    """Chunked prefill through paged tree attention (pages shuffled, boundaries inside chunks) gives the
    dense path's logits: same argmax everywhere, values within the fp32 attention op's error."""
    model = TinyTransformer.random(CFG, seed=0)
    prompt = torch.randint(0, CFG.vocab_size, (100,), generator=torch.Generator().manual_seed(1))
    dense, _ = model.forward_dense(prompt, DenseKV())
    tree = _prefill_paged(model, prompt, chunk, page)
    assert tree.shape == dense.shape == (100, CFG.vocab_size)
    assert torch.equal(tree.argmax(-1), dense.argmax(-1))
    torch.testing.assert_close(tree, dense, rtol=0, atol=2e-5)


def test_chain_anc_matches_reference_helper() -> None:
    from ddtree_engine.reference.tree_attention import anc_from_parents

    for n in (1, 31, 32, 33, 70):
        parents = torch.arange(-1, n - 1)[None]
        assert torch.equal(chain_anc(n, "cpu"), anc_from_parents(parents))


def test_exact_mode_is_row_invariant_in_linear_layers() -> None:
    """Linear layers accumulate in fp64 and round to fp32: a row's result does not depend on how many
    other rows share the matmul (the property the lossless tests rely on)."""
    model = TinyTransformer.random(CFG, seed=3)
    x = torch.randn(513, CFG.d_model, generator=torch.Generator().manual_seed(2))
    full = model.linear(x, "layers.0.w_gate")
    for rows in (slice(0, 1), slice(7, 8), slice(100, 117)):
        assert torch.equal(model.linear(x[rows], "layers.0.w_gate"), full[rows])


def test_save_load_roundtrip(tmp_path: pytest.TempPathFactory) -> None:
    weights = random_weights(CFG, seed=4)
    path = save_model(tmp_path / "tiny.pt", CFG, weights)  # type: ignore[operator]
    cfg2, w2 = load_model(path)
    assert cfg2 == CFG and set(w2) == set(weights)
    assert all(torch.equal(w2[k], weights[k]) for k in weights)
    a = ar_generate(TinyTransformer(CFG, weights), [1, 2, 3], 20)
    b = ar_generate(TinyTransformer(cfg2, w2), [1, 2, 3], 20)
    assert a == b


def test_load_rejects_foreign_file(tmp_path: pytest.TempPathFactory) -> None:
    bad = tmp_path / "x.pt"  # type: ignore[operator]
    torch.save({"hello": 1}, bad)
    with pytest.raises(ValueError, match="not a ddtree tiny-model file"):
        load_model(bad)


def test_safetensors_roundtrip_when_available(tmp_path: pytest.TempPathFactory) -> None:
    pytest.importorskip("safetensors")
    weights = random_weights(CFG, seed=4)
    cfg2, w2 = load_model(save_model(tmp_path / "m.safetensors", CFG, weights))  # type: ignore[operator]
    assert cfg2 == CFG and all(torch.equal(w2[k], weights[k]) for k in weights)


def test_ar_greedy_is_deterministic_and_varies_with_prompt() -> None:
    model = TinyTransformer.random(CFG, seed=0)
    a = ar_generate(model, [5, 6, 7], 40)
    assert a == ar_generate(model, [5, 6, 7], 40)
    assert len(a) == 40 and all(0 <= t < CFG.vocab_size for t in a)
    assert a != ar_generate(model, [5, 6, 8], 40)


def test_ar_stops_at_stop_token() -> None:
    model = TinyTransformer.random(CFG, seed=0)
    free = ar_generate(model, [9, 9], 30)
    stop = free[10]
    first = free.index(stop)
    assert ar_generate(model, [9, 9], 30, stop_ids=[stop]) == free[: first + 1]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3)
