"""The target model of bench_e2e.py and the profile scripts: the shape presets, the model options and the model they
build. Apart from the bench so that each file stays under 500 lines; the bench imports these names (and re-exports
them) and its CLI and output are as before."""

from __future__ import annotations

import argparse

import torch

from ddtree_engine.model import ModelConfig, TinyTransformer, random_weights

# Model presets. toy = the 2-layer model every session measured (fp32 linears, bf16 K/V). The qwen3 shapes are
# TinyTransformer with Qwen3's sizes (vocab 151,936, 28 layers, 16 q / 8 kv heads of 128, SwiGLU ffn) and
# random seeded bf16 weights drawn on the GPU; they omit Qwen3's q/k RMSNorm, tie nothing (Qwen3-0.6B ties
# embedding and lm_head; here both are separate tensors, which reads the same lm_head bytes per forward) and
# use rope_theta 10,000 (Qwen3: 1,000,000; no effect on cost).
PRESETS: dict[str, dict[str, object]] = {
    "toy": dict(cfg=dict(vocab_size=320, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=352),
                act=torch.float32, drafter_ffn=128),
    "qwen3-0.6b": dict(cfg=dict(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                                head_dim=128, ffn_dim=3072), act=torch.bfloat16, drafter_ffn=3072),
    "qwen3-1.7b": dict(cfg=dict(vocab_size=151936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8,
                                head_dim=128, ffn_dim=6144), act=torch.bfloat16, drafter_ffn=6144),
}


def build_model(args: argparse.Namespace, device: str) -> tuple[TinyTransformer, int]:
    """(fast-mode model on `device`, drafter ffn width) from --preset, else from the model args (fp32 linears,
    bf16 K/V, weights from the CPU generator: the pre-session-9 default)."""
    if getattr(args, "preset", None):
        p = PRESETS[args.preset]
        cfg = ModelConfig(**p["cfg"])  # type: ignore[arg-type]
        act: torch.dtype = p["act"]  # type: ignore[assignment]
        if act == torch.float32:
            weights = random_weights(cfg, 0)
        else:  # bf16 on the device from a CUDA generator: ~1.5 GB of weights in milliseconds
            weights = random_weights(cfg, 0, device=device, dtype=act)
        model = TinyTransformer(cfg, weights, device=device, exact=False, act_dtype=act, kv_dtype=torch.bfloat16)
        return model, int(p["drafter_ffn"])  # type: ignore[call-overload]
    cfg = model_config(args)
    return TinyTransformer.random(cfg, seed=0, device=device, exact=False, kv_dtype=torch.bfloat16), 128


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The target model's shape options (shared with profile/e2e_round_profile.py)."""
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="model shape and dtypes (overrides the shape options below): toy (the 2-layer default), "
                         "qwen3-0.6b, qwen3-1.7b (Qwen3 shapes, bf16 linears and K/V, random seeded weights)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64, help="64 (the default tiny model), 128 or 256")
    ap.add_argument("--vocab", type=int, default=320)


def model_config(args: argparse.Namespace) -> ModelConfig:
    d = args.d_model
    return ModelConfig(vocab_size=args.vocab, d_model=d, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, head_dim=args.head_dim, ffn_dim=(d * 8 // 3 + 15) // 16 * 16)
