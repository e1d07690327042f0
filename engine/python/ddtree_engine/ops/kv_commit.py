"""kv_commit over libddtree (semantics: reference/kv_commit.py). One launch moves all layers' rows
(up to 128 layers per launch) and advances ctx_len; capturable in a CUDA graph after one warm-up call."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import arrival_counters, cuda_device_of, error_flags, ptr, require, stream_handle

def _fn() -> object:
    vp, i32 = ctypes.c_void_p, ctypes.c_int32
    return _lib.function(
        "ddtree_kv_commit",
        [vp, vp, i32, i32, i32, ctypes.c_int64, vp, i32, i32, vp, i32, vp, vp, vp, vp, vp],
    )


def kv_commit(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
              accept_nodes: torch.Tensor, accept_len: torch.Tensor, ctx_len: torch.Tensor) -> None:
    """Move accepted nodes' K/V rows to their committed slots in all layers; ctx_len += accept_len."""
    caches = list(k_caches) + list(v_caches)
    require(len(v_caches) in (0, len(k_caches)), "v_caches must be empty or as many as k_caches")
    require(len(caches) > 0, "at least one cache is needed")
    shape, dtype = caches[0].shape, caches[0].dtype
    require(len(shape) >= 2, f"caches must be [P, page_size, ...], got shape {tuple(shape)}")
    for c in caches:
        require(c.shape == shape and c.dtype == dtype, "all caches must share shape and dtype")
        require(c.is_contiguous(), "caches must be contiguous")
    require(block_table.dim() == 2 and block_table.dtype == torch.int32 and block_table.is_contiguous(),
            "block_table must be a contiguous [B, max_pages] int32 tensor")
    batch, max_pages = block_table.shape
    require(accept_nodes.dim() == 2 and accept_nodes.shape[0] == batch and accept_nodes.dtype == torch.int32
            and accept_nodes.is_contiguous(), f"accept_nodes must be a contiguous [{batch}, W] int32 tensor")
    for name, t in (("accept_len", accept_len), ("ctx_len", ctx_len)):
        require(tuple(t.shape) == (batch,) and t.dtype == torch.int32 and t.is_contiguous(),
                f"{name} must be a contiguous [{batch}] int32 tensor")
    device = cuda_device_of(*caches, block_table, accept_nodes, accept_len, ctx_len)
    if batch == 0:
        return
    num_pages, page_size = shape[0], shape[1]
    row_bytes = caches[0][0, 0].numel() * caches[0].element_size()
    layers = len(k_caches)
    k_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in k_caches])
    v_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in v_caches]) if v_caches else None
    counters = arrival_counters("kv_commit", device, batch)
    with torch.cuda.device(device):
        status = _fn()(  # type: ignore[operator]
            ctypes.cast(k_ptrs, ctypes.c_void_p), ctypes.cast(v_ptrs, ctypes.c_void_p) if v_ptrs else None, layers, num_pages, page_size, row_bytes, ptr(block_table), batch, max_pages,
            ptr(accept_nodes), accept_nodes.shape[1], ptr(accept_len), ptr(ctx_len), ptr(counters),
            ptr(error_flags(device)), stream_handle(device),
        )
    _lib.check(status, "ddtree_kv_commit")
