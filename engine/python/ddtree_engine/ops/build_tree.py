"""build_tree over libddtree (see reference/build_tree.py for the exact semantics).

Same signature and outputs as the reference. Never synchronizes the host: budgets stay on the device,
outputs are padded to n_max, so the op can be captured in a CUDA graph."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import cuda_device_of, ptr, require, stream_handle
from ddtree_engine.reference.build_tree import BuildTreeOutput

MAX_DEPTH = 63
MAX_K = 32768
MAX_NODES = 1025

__all__ = ["BuildTreeOutput", "build_tree"]


def _fn() -> object:
    return _lib.function(
        "ddtree_build_tree",
        [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 8 + [ctypes.c_void_p],
    )


def build_tree(
    top_lp: torch.Tensor,
    top_id: torch.Tensor,
    root_token: torch.Tensor,
    ctx_len: torch.Tensor,
    budget: torch.Tensor,
    n_max: int,
) -> BuildTreeOutput:
    """top_lp [B, L, K] f32 (rows sorted descending), top_id [B, L, K] i32, root_token/ctx_len/budget
    [B] i32 (CUDA, contiguous); n_max <= 1025 padded nodes (root included)."""
    require(top_lp.dim() == 3 and top_id.shape == top_lp.shape,
            f"top_lp/top_id must both be [B, L, K], got {tuple(top_lp.shape)} / {tuple(top_id.shape)}")
    bsz, depth, k = top_lp.shape
    require(top_lp.dtype == torch.float32, f"top_lp must be float32, got {top_lp.dtype}")
    require(top_id.dtype == torch.int32, f"top_id must be int32, got {top_id.dtype}")
    require(0 <= depth <= MAX_DEPTH, f"L must be in [0, {MAX_DEPTH}], got {depth}")
    require(1 <= k <= MAX_K, f"K must be in [1, {MAX_K}], got {k}")
    require(1 <= n_max <= MAX_NODES, f"n_max must be in [1, {MAX_NODES}] (budget <= {MAX_NODES - 1}), got {n_max}")
    for name, t in (("root_token", root_token), ("ctx_len", ctx_len), ("budget", budget)):
        require(t.shape == (bsz,), f"{name} must be [B] = [{bsz}], got {tuple(t.shape)}")
        require(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")
    tensors = (top_lp, top_id, root_token, ctx_len, budget)
    for name, t in zip(("top_lp", "top_id", "root_token", "ctx_len", "budget"), tensors):
        require(t.is_contiguous(), f"{name} must be contiguous")
    device = cuda_device_of(*tensors)
    words = (n_max + 31) // 32

    def nodes() -> torch.Tensor:
        return torch.empty((bsz, n_max), dtype=torch.int32, device=device)

    out = BuildTreeOutput(
        node_token=nodes(), node_parent=nodes(), node_depth=nodes(),
        num_nodes=torch.empty((bsz,), dtype=torch.int32, device=device),
        anc=torch.empty((bsz, n_max, words), dtype=torch.int32, device=device),
        positions=nodes(), first_child=nodes(), next_sibling=nodes(),
    )
    if bsz == 0:
        return out
    with torch.cuda.device(device):
        status = _fn()(  # type: ignore[operator]
            ptr(top_lp), ptr(top_id), ptr(root_token), ptr(ctx_len), ptr(budget),
            bsz, depth, k, n_max,
            ptr(out.node_token), ptr(out.node_parent), ptr(out.node_depth), ptr(out.num_nodes),
            ptr(out.anc), ptr(out.positions), ptr(out.first_child), ptr(out.next_sibling),
            stream_handle(device),
        )
    _lib.check(status, "ddtree_build_tree")
    return out
