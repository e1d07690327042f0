"""qkv_prep over libddtree (semantics: reference/qkv_prep.py): RoPE of q and k, q written contiguous, K/V rows
written into the paged caches, in one launch (PDL: it overlaps its predecessor's tail and lets tree_attention's
prologue overlap its own). Capturable in a CUDA graph."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import cuda_device_of, error_flags, ptr, require, stream_handle

_DTYPES = {torch.float32: _lib.DTYPE_FLOAT32, torch.bfloat16: _lib.DTYPE_BFLOAT16}


def _fn() -> object:
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    return _lib.function(
        "ddtree_qkv_prep",
        [vp, i64, ctypes.c_int, vp, vp, vp, i32, i32, i32, i32, vp, vp, vp, i64, ctypes.c_int, vp, vp],
    )


def supports(qkv_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel takes these dtypes and head_dim (the model falls back to the torch sequence otherwise)."""
    if qkv_dtype not in _DTYPES or cache_dtype not in _DTYPES:
        return False
    vec = 16 // (4 if qkv_dtype == torch.float32 else 2)
    return head_dim % (2 * vec) == 0 and 2 * vec <= head_dim <= 1024


def qkv_prep(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> torch.Tensor:
    """Same arguments and effects as reference.qkv_prep; q [T, Hq, D] is allocated here (stream-ordered, so
    capturable)."""
    require(k_cache.dim() == 4 and k_cache.is_contiguous() and v_cache.shape == k_cache.shape
            and v_cache.dtype == k_cache.dtype and v_cache.is_contiguous(),
            "k_cache and v_cache must be contiguous [P, page_size, Hkv, D] tensors of one shape and dtype")
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    require(qkv.dim() == 2 and qkv.stride(1) == 1, "qkv must be [T, (Hq + 2 Hkv) * D] with contiguous rows")
    t = qkv.shape[0]
    require(qkv.shape[1] % d == 0 and qkv.shape[1] // d > 2 * hkv,
            f"qkv rows ({qkv.shape[1]}) must hold Hq >= 1 query heads and 2 x {hkv} K/V heads of {d}")
    require(qkv.dtype in _DTYPES and k_cache.dtype in _DTYPES, "qkv and the caches must be float32 or bfloat16")
    for name, tab in (("cos", cos), ("sin", sin)):
        require(tab.numel() == t * d and tab.dtype == qkv.dtype and tab.is_contiguous(),
                f"{name} must be a contiguous [{t}, {d}] {qkv.dtype} tensor")
    require(tuple(slots.shape) == (t,) and slots.dtype == torch.int64 and slots.is_contiguous(),
            f"slots must be a contiguous [{t}] int64 tensor")
    hq = qkv.shape[1] // d - 2 * hkv
    device = cuda_device_of(qkv, cos, sin, slots, k_cache, v_cache)
    q = torch.empty(t, hq, d, dtype=k_cache.dtype, device=device)
    if t == 0:
        return q
    with torch.cuda.device(device):
        status = _fn()(  # type: ignore[operator]
            ptr(qkv), qkv.stride(0), _DTYPES[qkv.dtype], ptr(cos), ptr(sin), ptr(slots), t, hq, hkv, d, ptr(q),
            ptr(k_cache), ptr(v_cache), k_cache.shape[0] * k_cache.shape[1], _DTYPES[k_cache.dtype],
            ptr(error_flags(device)), stream_handle(device),
        )
    _lib.check(status, "ddtree_qkv_prep")
    return q
