"""A small decoder-only transformer: RMSNorm, RoPE, GQA attention over a paged KV cache, SwiGLU MLP.

Two forward paths share every layer function:
  * `forward_tree` — the engine's path: N tokens per request (a draft tree, or a chain for prefill) at
    explicit positions; their K/V go to cache slots ctx_len + node index; attention goes through the
    injected backend's `tree_attention` (ancestor bitsets, paged cache).
  * `forward_dense` — an independent, deliberately plain path for the autoregressive reference decoder:
    contiguous per-request K/V tensors and a dense causal softmax written out here.

Numerics ("exact" mode, the default on CPU and in the lossless tests). DDTree must reproduce AR decoding
token for token, but the two paths evaluate the same math on different batch shapes (N tree rows vs 1
row; keys at different slots, masked keys in between). BLAS and vectorized kernels may round such shapes
differently (different blocking, a scalar tail loop for exp/log), so a plain fp32 model would differ by
~1 ulp now and then and flip an argmax at a near-tie. In exact mode every op accumulates in float64 and its
result is rounded to float32 (activations, K/V, logits all hold fp32 values). The two paths' fp64 results
differ by ~1e-16 relative, so a rounded value differs only when it straddles an fp32 rounding boundary:
probability ~2^-52/2^-24 ≈ 4e-9 per element, i.e. ~1e-9 flips over a whole test suite, instead of a
certainty. The rounded values are then bit-identical and so are logits, argmax and Gumbel-max.
Attention is the exception we do not own: it runs inside the backend's `tree_attention`, and the current
PyTorch reference computes in fp32 whatever the input dtype, so tree-vs-dense attention outputs differ by
up to ~1e-7 relative and logits by a few 1e-6 (measured). The lossless tests therefore also report the
smallest top-2 logit margin along every reference trajectory (it must exceed that error for their fixed
seeds). Pass kv_dtype=torch.float64 with an fp64-computing attention op to close this gap entirely (then
measured bit-identical logits).

"fast" mode (exact=False: GPU benchmarks, the server on a GPU, the CUDA tree-attention kernel, which takes
bf16): its own layer functions, written the way a serving stack runs a small LLM. Weights held on the device
in `act_dtype` (bf16 for the realistic benchmark presets), Q/K/V as one GEMM and gate/up as one GEMM over
weights concatenated once at construction, `torch.nn.functional.rms_norm`, RoPE cos/sin computed once per
forward in fp32 (not per layer, not in fp64), the residual adds folded into the output GEMMs (addmm), logits
written as fp32 straight from the lm_head GEMM where the backend can (torch.mm out_dtype), no fp64
anywhere. K/V cache in `kv_dtype` (bf16 for the kernel). Static shapes, CUDA-graph capturable, the same
outputs as the exact path (logits [B, N, V] fp32, hidden [B, N, d] in act_dtype). Not bit-reproducible across
shapes; exact mode never touches these functions.

`logits_dtype` (fast path only): fp32 (the default, above) or act_dtype. With act_dtype (bf16) the lm_head GEMM
writes its own dtype, the way a bf16 serving stack's lm_head does: half the bytes written, and the engine's
tree_accept reads them as they are (its argmax / Gumbel-max on the fp32 value of each bf16 logit, ties to the
lowest id; no cast kernel anywhere). At V = 151,936 and 8 x 65 nodes that is 158 MB instead of 316 MB written by
the forward and read by the accept. The greedy target is then argmax of the bf16-rounded logits: the same
function for the AR peer and for DDTree, so lossless stays lossless, but it is not the fp32-logit model's argmax
where the top two logits round to one bf16 value (ties go to the lower id). Settable between captures (the
bench's before/after in one process)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ddtree_engine.backend import OpBackend


# Row counts (inclusive) whose fp32 GEMMs `gemm` runs operand-swapped.
SLOW_FP32_GEMM_ROWS = (8, 16)


def gemm(a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ w[N, K]^T (+ residual [M, N]) as a contiguous [M, N]: the fast path's and the fast drafter's
    GEMMs. fp32 products of 8-16 rows go through the operand-swapped form (w a^T)^T: cuBLAS (CUDA 13, H200)
    runs fp32 GEMMs of 8 <= M <= 16 rows on a kernel that took 24-52 µs for the toy's shapes against 2-10 µs
    at M = 1 or M >= 17, and 6.6-7.6 µs swapped (bf16 is unaffected: ~2.5 µs at every M; NOTES "Session 9
    (lead): the AR peer's batch-8 GEMMs"). Without it the toy's batch-8 AR peer spent 330 of its 473 µs round
    in nine such GEMMs. The same products either way (one fp32 dot product per output element), so it is
    applied on every device: the CPU tests run this branch too. Autograd flows through both forms."""
    lo, hi = SLOW_FP32_GEMM_ROWS
    if a.dtype == torch.float32 and a.dim() == 2 and lo <= a.shape[0] <= hi:
        if residual is None:
            return torch.mm(w, a.t()).t().contiguous()
        return torch.addmm(residual.t(), w, a.t()).t().contiguous()
    if residual is None:
        return torch.nn.functional.linear(a, w)
    return torch.addmm(residual, a, w.t())


@dataclass(frozen=True)
class ModelConfig:
    # Defaults = the server's test model. head_dim 64 because the CUDA tree-attention kernel takes
    # head_dim 64/128/256; the CPU lossless tests use an even smaller config (head_dim 16).
    vocab_size: int = 320
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    ffn_dim: int = 352
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # Scale of the lm_head init: larger gives peakier next-token distributions.
    logit_scale: float = 3.0

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


def random_weights(cfg: ModelConfig, seed: int, *, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded weights. Default: fp32 from a CPU generator, so the same seed gives the same model on every
    machine (what the lossless tests and the server use). `device`/`dtype` draw them where they will live
    instead (e.g. bf16 on the GPU from a CUDA generator: the benchmark presets' ~0.6-1.7B parameters take
    milliseconds there, a CPU fp32 randn of that size takes many seconds); same seed, different numbers."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype, device=dev) * std

    d, hd = cfg.d_model, cfg.head_dim
    w: dict[str, torch.Tensor] = {"embed": normal(cfg.vocab_size, d, std=1.0)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = 1.0 + normal(d, std=0.1)
        w[p + "wq"] = normal(cfg.n_heads * hd, d, std=d**-0.5)
        w[p + "wk"] = normal(cfg.n_kv_heads * hd, d, std=d**-0.5)
        w[p + "wv"] = normal(cfg.n_kv_heads * hd, d, std=d**-0.5)
        w[p + "wo"] = normal(d, cfg.n_heads * hd, std=(cfg.n_heads * hd) ** -0.5)
        w[p + "mlp_norm"] = 1.0 + normal(d, std=0.1)
        w[p + "w_gate"] = normal(cfg.ffn_dim, d, std=d**-0.5)
        w[p + "w_up"] = normal(cfg.ffn_dim, d, std=d**-0.5)
        w[p + "w_down"] = normal(d, cfg.ffn_dim, std=cfg.ffn_dim**-0.5)
    w["final_norm"] = 1.0 + normal(d, std=0.1)
    w["lm_head"] = normal(cfg.vocab_size, d, std=cfg.logit_scale * d**-0.5)
    return w


def tree_cache_slots(block_table: torch.Tensor, ctx_len: torch.Tensor, n: int, page: int) -> torch.Tensor:
    """Flat cache rows [B*n] (distinct) of slots ctx_len[b] + j, j < n, through the block table: where both
    forward paths write the tree's K/V."""
    slot = ctx_len.long()[:, None] + torch.arange(n, device=ctx_len.device)[None, :]  # [B, n]
    page_idx = torch.gather(block_table.long(), 1, torch.div(slot, page, rounding_mode="floor"))
    return (page_idx * page + slot % page).reshape(-1)


@dataclass
class DenseKV:
    """Contiguous K/V of one request for the AR reference path: per layer [S, Hkv, D] float64."""

    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.k else int(self.k[0].shape[0])


class TinyTransformer:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        device: str | torch.device = "cpu",
        exact: bool = True,
        act_dtype: torch.dtype = torch.float32,
        kv_dtype: torch.dtype | None = None,
        logits_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.exact = exact
        # exact=False runs the fused fast path below unless DDTREE_MODEL_FAST=0, which keeps the pre-session-9
        # fast mode (the exact path's layer functions computing in act_dtype, unfused) for A/B runs.
        self.fast = not exact and os.environ.get("DDTREE_MODEL_FAST", "1") != "0"
        self.act_dtype = torch.float32 if exact else act_dtype
        if logits_dtype not in (torch.float32, self.act_dtype) or (logits_dtype != torch.float32 and not self.fast):
            raise ValueError(f"logits_dtype must be float32 or act_dtype ({self.act_dtype}) on the fast path, got "
                             f"{logits_dtype}")
        self.logits_dtype = logits_dtype
        # Fast path, bf16 K/V: the layer's RoPE + K/V cache write + q run through the backend's fused qkv_prep op
        # (one launch instead of ~6 torch kernels; see _fast_layer_qkv); DDTREE_QKV_PREP=0 keeps the torch
        # sequence. Measured in the session-10 final run (NOTES "Final verification run (session 10)"). Read here,
        # at construction; the attribute may be flipped between captures (bench_forward_ab --ab qkv_prep).
        self.qkv_prep = os.environ.get("DDTREE_QKV_PREP", "1") != "0"
        # K/V hold act-dtype-rounded values; the cache dtype is what the attention op computes in
        # (fp32 by default; fp64 storage lets an fp64-capable attention op keep the exact scheme end to end).
        self.kv_dtype = kv_dtype or self.act_dtype
        self._compute = torch.float64 if exact else self.act_dtype
        missing = expected_weight_names(cfg) - set(weights)
        if missing:
            raise ValueError(f"weights are missing {sorted(missing)[:5]}")
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        half = cfg.head_dim // 2
        if self.fast:
            # The fast path keeps only device copies in act_dtype (fused where it multiplies), no fp32 master.
            self.weights = weights
            self._build_fast(weights)
            return
        self.weights = {k: v.to(torch.float32) for k, v in weights.items()}
        self.w = {k: v.to(self.device, self._compute) for k, v in self.weights.items()}
        self._inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(half, dtype=torch.float64, device=self.device) / half)
        )

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0, **kw: Any) -> TinyTransformer:
        return cls(cfg, random_weights(cfg, seed), **kw)

    # ---- layer functions (shared by both paths) -----------------------------------------------------
    def _round(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.act_dtype)

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self._round(x.to(self._compute) @ self.w[name].t())

    def rmsnorm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        xc = x.to(self._compute)
        inv = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + self.cfg.norm_eps)
        return self._round(xc * inv * self.w[name])

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """NeoX-style rotary embedding; x [T, H, D], pos [T] (any int dtype)."""
        ang = pos.to(torch.float64)[:, None] * self._inv_freq[None, :]  # [T, D/2]
        cos = ang.cos()[:, None, :].to(self._compute)
        sin = ang.sin()[:, None, :].to(self._compute)
        xc = x.to(self._compute)
        x1, x2 = xc.chunk(2, dim=-1)
        return self._round(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))

    def mlp(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self.fast:
            return self._fast_mlp(x, i)
        p = f"layers.{i}."
        h = self.rmsnorm(x, p + "mlp_norm")
        gate = self.linear(h, p + "w_gate").to(self._compute)
        up = self.linear(h, p + "w_up").to(self._compute)
        act = self._round(torch.nn.functional.silu(gate) * up)
        return self.linear(act, p + "w_down")

    def qkv(self, x: torch.Tensor, i: int, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fast:
            q, k, v = self._fast_qkv(x, i, self._rope_tables(pos))
            return q.contiguous(), k, v
        cfg, p = self.cfg, f"layers.{i}."
        h = self.rmsnorm(x, p + "attn_norm")
        q = self.linear(h, p + "wq").view(-1, cfg.n_heads, cfg.head_dim)
        k = self.linear(h, p + "wk").view(-1, cfg.n_kv_heads, cfg.head_dim)
        v = self.linear(h, p + "wv").view(-1, cfg.n_kv_heads, cfg.head_dim)
        return self.rope(q, pos), self.rope(k, pos), v

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return self.f["embed"][tokens.long()]
        return self.weights_on_device("embed")[tokens.long()]

    def weights_on_device(self, name: str) -> torch.Tensor:
        # fp32 master copy on the device, cached (the embedding table is read, never multiplied).
        cache = self.__dict__.setdefault("_dev32", {})
        if name not in cache:
            cache[name] = self.weights[name].to(self.device, self.act_dtype)
        return cache[name]

    def head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, final hidden) of residual stream x: logits fp32, or logits_dtype on the fast path."""
        if self.fast:
            return self._fast_head(x)
        h = self.rmsnorm(x, "final_norm")
        return self.linear(h, "lm_head").to(torch.float32), h

    # ---- fast path (exact=False): fused weights, act_dtype, no fp64 ---------------------------------
    def _build_fast(self, weights: dict[str, torch.Tensor]) -> None:
        """Device copies in act_dtype, built once: per layer wqkv = [wq; wk; wv] and w_gu = [w_gate; w_up]
        (one GEMM each instead of three and two), the norms' scales, the RoPE inverse frequencies in fp32."""
        cfg, dev, dt = self.cfg, self.device, self.act_dtype

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, dt).contiguous()

        f: dict[str, torch.Tensor] = {"embed": put(weights["embed"]), "final_norm": put(weights["final_norm"]),
                                      "lm_head": put(weights["lm_head"])}
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            f[p + "wqkv"] = put(torch.cat([weights[p + "wq"], weights[p + "wk"], weights[p + "wv"]]))
            f[p + "w_gu"] = put(torch.cat([weights[p + "w_gate"], weights[p + "w_up"]]))
            for n in ("wo", "w_down", "attn_norm", "mlp_norm"):
                f[p + n] = put(weights[p + n])
        self.f = f
        half = cfg.head_dim // 2
        self._inv_freq32 = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32, device=dev) / half))
        # fp32 logits straight out of the lm_head GEMM (cuBLAS bf16 x bf16 -> fp32) where torch offers it
        # (torch.mm's out_dtype, CUDA); else the GEMM in act_dtype and one cast.
        self._mm_f32 = False
        if dev.type == "cuda" and dt != torch.float32:
            try:
                a = torch.ones(2, 8, device=dev, dtype=dt)
                self._mm_f32 = torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
            except (RuntimeError, TypeError):
                self._mm_f32 = False

    def fast_weight_bytes(self) -> int:
        """Bytes of weights one forward reads (every matrix and norm scale once; the embedding table is
        gathered, T rows, so it is not counted): the numerator of the forward's byte floor."""
        src = self.f if self.fast else self.w
        return sum(t.numel() * t.element_size() for k, t in src.items() if k != "embed")

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (self.cfg.d_model,), self.f[name], self.cfg.norm_eps)

    def _gemm(self, a: torch.Tensor, name: str, residual: torch.Tensor | None = None) -> torch.Tensor:
        return gemm(a, self.f[name], residual)

    def _rope_tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos [T, 1, D] and sign-folded sin [T, 1, D] (-sin on the first half) in act_dtype, once per
        forward: rope(x) = x * cos + swap_halves(x) * sin."""
        ang = pos.to(torch.float32)[:, None] * self._inv_freq32[None, :]  # [T, D/2]
        cos, sin = ang.cos(), ang.sin()
        c = torch.cat([cos, cos], dim=-1)[:, None, :].to(self.act_dtype)
        s = torch.cat([-sin, sin], dim=-1)[:, None, :].to(self.act_dtype)
        return c, s

    def _fast_rope(self, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """NeoX rotary embedding of x [T, H, D] (q and k heads together): three kernels."""
        T, H, D = x.shape
        swapped = x.view(T, H, 2, D // 2).flip(2).view(T, H, D)
        return torch.addcmul(x * tables[0], swapped, tables[1])

    def _fast_qkv(self, x: torch.Tensor, i: int,
                  tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [T, Hq, D] view, k [T, Hkv, D] view, v [T, Hkv, D] view) after RoPE: q and k are views into
        one rotated [T, Hq + Hkv, D] tensor."""
        cfg, p = self.cfg, f"layers.{i}."
        T, hq, hkv, D = x.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = self._gemm(self._norm(x, p + "attn_norm"), p + "wqkv")
        qk = self._fast_rope(qkv[:, : (hq + hkv) * D].view(T, hq + hkv, D), tables)
        v = qkv[:, (hq + hkv) * D :].view(T, hkv, D)
        return qk[:, :hq], qk[:, hq:], v

    def _fused_qkv_prep(self, backend: OpBackend) -> Any:
        """backend.qkv_prep when this forward may use it: fast path, bf16 K/V, a qkv dtype and head_dim the
        kernel takes (the same rule on every backend, so the CPU reference runs what the GPU runs); else None."""
        from ddtree_engine.ops.qkv_prep import supports

        if not (self.fast and self.qkv_prep and backend.qkv_prep is not None and self.kv_dtype == torch.bfloat16):
            return None
        return backend.qkv_prep if supports(self.act_dtype, self.kv_dtype, self.cfg.head_dim) else None

    def _fast_layer_qkv(self, fused: Any, x: torch.Tensor, i: int, tables: tuple[torch.Tensor, torch.Tensor],
                        k_cache: torch.Tensor, v_cache: torch.Tensor, flat_slot: torch.Tensor) -> torch.Tensor:
        """Layer i's q [T, Hq, D] (contiguous, kv_dtype) after writing its K/V rows to the cache slots. With the
        fused op: RoPE in fp32 and one rounding (the torch sequence rounds x * cos to act_dtype before the add),
        so the two differ within bf16 rounding (test_qkv_prep.py states the bound)."""
        cfg = self.cfg
        if fused is not None:
            qkv = self._gemm(self._norm(x, f"layers.{i}.attn_norm"), f"layers.{i}.wqkv")
            q: torch.Tensor = fused(qkv, tables[0], tables[1], flat_slot, k_cache, v_cache)
            return q
        q, k, v = self._fast_qkv(x, i, tables)
        k_cache.view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, flat_slot, k.to(self.kv_dtype))
        v_cache.view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, flat_slot, v.to(self.kv_dtype))
        return q.to(self.kv_dtype).contiguous()

    def _fast_attn_out(self, o: torch.Tensor, x: torch.Tensor, i: int) -> torch.Tensor:
        """x + o @ wo^T in one GEMM (addmm: the residual add is the GEMM's epilogue)."""
        return self._gemm(o, f"layers.{i}.wo", residual=x)

    def _fast_mlp(self, x: torch.Tensor, i: int) -> torch.Tensor:
        p = f"layers.{i}."
        gate, up = self._gemm(self._norm(x, p + "mlp_norm"), p + "w_gu").chunk(2, dim=-1)
        return self._gemm(torch.nn.functional.silu(gate) * up, p + "w_down")

    def _fast_mlp_residual(self, x: torch.Tensor, i: int) -> torch.Tensor:
        p = f"layers.{i}."
        gate, up = self._gemm(self._norm(x, p + "mlp_norm"), p + "w_gu").chunk(2, dim=-1)
        return self._gemm(torch.nn.functional.silu(gate) * up, p + "w_down", residual=x)

    def _fast_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self._norm(x, "final_norm")
        if self.logits_dtype == self.act_dtype:  # the GEMM's own dtype: no cast, no fp32 bytes
            return self._gemm(h, "lm_head"), h
        if self._mm_f32:
            return torch.mm(h, self.f["lm_head"].t(), out_dtype=torch.float32), h
        return self._gemm(h, "lm_head").to(torch.float32), h

    def _fast_forward_tree(
        self, backend: OpBackend, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
        block_table: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, ctx_len: torch.Tensor,
        anc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_tree's contract on the fast layer functions (see the module docstring)."""
        B, N = tokens.shape
        cfg = self.cfg
        flat_slot = tree_cache_slots(block_table, ctx_len, N, k_caches[0].shape[1])
        qo_indptr = torch.arange(0, (B + 1) * N, N, device=tokens.device, dtype=torch.int32)
        tables = self._rope_tables(positions.reshape(-1))
        x = self.embed(tokens.reshape(-1).clamp(min=0))
        fused = self._fused_qkv_prep(backend)
        for i in range(cfg.n_layers):
            q = self._fast_layer_qkv(fused, x, i, tables, k_caches[i], v_caches[i], flat_slot)
            # After qkv_prep (a PDL kernel that writes only q and cache rows) fa3 may read qo_indptr, ctx_len, the
            # block table and anc before its PDL wait: inputs_ready=True is that promise (ops/tree_attention.py).
            ready = {"inputs_ready": True} if fused is not None else {}
            o, _ = backend.tree_attention(
                q, k_caches[i], v_caches[i], qo_indptr, block_table, ctx_len, anc, self.sm_scale, **ready,
            )
            x = self._fast_attn_out(o.reshape(B * N, -1).to(self.act_dtype), x, i)
            x = self._fast_mlp_residual(x, i)
        logits, hidden = self._fast_head(x)
        return logits.view(B, N, -1), hidden.view(B, N, -1)

    # ---- engine path --------------------------------------------------------------------------------
    def forward_tree(
        self,
        backend: OpBackend,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        block_table: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        ctx_len: torch.Tensor,
        anc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens/positions [B, N] (token -1 = padding), ctx_len [B] i32, anc [B, N, W] i32.
        Writes node j's K/V of request b to cache slot ctx_len[b] + j in every layer (the caller commits
        or discards them). Returns (logits [B, N, V] fp32, final hidden [B, N, d]). Static shapes, no
        host sync: capturable in a CUDA graph when the backend is."""
        if self.fast:
            return self._fast_forward_tree(backend, k_caches, v_caches, block_table, tokens, positions, ctx_len, anc)
        B, N = tokens.shape
        cfg = self.cfg
        flat_slot = tree_cache_slots(block_table, ctx_len, N, k_caches[0].shape[1])
        pos = positions.reshape(-1)
        qo_indptr = torch.arange(0, (B + 1) * N, N, device=tokens.device, dtype=torch.int32)
        x = self.embed(tokens.reshape(-1).clamp(min=0))
        for i in range(cfg.n_layers):
            q, k, v = self.qkv(x, i, pos)
            k_caches[i].view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, flat_slot, k.to(self.kv_dtype))
            v_caches[i].view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, flat_slot, v.to(self.kv_dtype))
            o, _ = backend.tree_attention(
                q.to(self.kv_dtype), k_caches[i], v_caches[i], qo_indptr, block_table, ctx_len, anc,
                self.sm_scale,
            )
            attn = self.linear(self._round(o).reshape(B * N, -1), f"layers.{i}.wo")
            x = self._round(x.to(self._compute) + attn.to(self._compute))
            x = self._round(x.to(self._compute) + self.mlp(x, i).to(self._compute))
        logits, hidden = self.head(x)
        return logits.view(B, N, -1), hidden.view(B, N, -1)

    # ---- independent reference path ----------------------------------------------------------------
    def forward_dense(self, tokens: torch.Tensor, kv: DenseKV) -> tuple[torch.Tensor, torch.Tensor]:
        """One request: append `tokens` [n] after the kv.length tokens already in `kv` (causal among
        themselves). Plain softmax attention in the compute dtype; returns (logits [n, V], hidden [n, d])."""
        cfg = self.cfg
        n, s0 = int(tokens.shape[0]), kv.length
        pos = torch.arange(s0, s0 + n, device=self.device)
        causal = torch.ones(n, s0 + n, dtype=torch.bool, device=self.device).tril(diagonal=s0)
        x = self.embed(tokens)
        rep = cfg.n_heads // cfg.n_kv_heads
        for i in range(cfg.n_layers):
            q, k, v = self.qkv(x, i, pos)
            kc, vc = k.to(self.kv_dtype), v.to(self.kv_dtype)
            if len(kv.k) <= i:
                kv.k.append(kc)
                kv.v.append(vc)
            else:
                kv.k[i] = torch.cat([kv.k[i], kc])
                kv.v[i] = torch.cat([kv.v[i], vc])
            # Exact mode: fp64; fast path: fp32 (this is the plain reference path, not the fast one).
            cdt = torch.float32 if self.fast else self._compute
            keys = kv.k[i].repeat_interleave(rep, dim=1).to(cdt)  # [S, Hq, D]
            vals = kv.v[i].repeat_interleave(rep, dim=1).to(cdt)
            scores = torch.einsum("nhd,shd->hns", q.to(cdt), keys) * self.sm_scale
            scores = scores.masked_fill(~causal[None], float("-inf"))
            o = torch.einsum("hns,shd->nhd", scores.softmax(dim=-1), vals)
            if self.fast:
                x = self._fast_attn_out(o.to(self.act_dtype).reshape(n, -1), x, i)
                x = self._fast_mlp_residual(x, i)
                continue
            attn = self.linear(self._round(o).reshape(n, -1), f"layers.{i}.wo")
            x = self._round(x.to(self._compute) + attn.to(self._compute))
            x = self._round(x.to(self._compute) + self.mlp(x, i).to(self._compute))
        return self.head(x)


def expected_weight_names(cfg: ModelConfig) -> set[str]:
    """The weight names a model of `cfg` needs (the constructor and model_io.load_model check them)."""
    names = {"embed", "final_norm", "lm_head"}
    for i in range(cfg.n_layers):
        names |= {f"layers.{i}.{n}" for n in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm",
                                                "w_gate", "w_up", "w_down")}
    return names

