"""draft_topk_lse over libddtree (see reference/draft_topk_lse.py for the exact semantics).

The library has three implementations (engine/bench/NOTES.md): v4 (one launch, a thread-block cluster per
row; k <= 64 on sm_90+), v3 (k <= 64, two launches) and v2 (any k). `draft_topk_lse` uses the library's
default (v4 where it applies, else v3 for k <= 16, else v2; DDTREE_TOPK_IMPL=v2 or =v3 in the environment
makes that version the default; default calls that resolve to v4 run a one-warp-per-row kernel instead for
256 < vocab <= 384 and k >= 16, where it measured faster (NOTES, session 6), and for any vocab <= 1024 with
DDTREE_TOPK_SMALL=1; DDTREE_TOPK_SMALL=0 keeps v4; read on every call); `draft_topk_lse_impl(logits, k, "v2" | "v3" | "v4")` picks one per
call, for tests and benches."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import check_errors, cuda_device_of, error_flags, ptr, require, stream_handle

MAX_K = 1024
_DTYPES = {torch.float32: _lib.DTYPE_FLOAT32, torch.bfloat16: _lib.DTYPE_BFLOAT16}
IMPLS = {"default": 0, "v2": 2, "v3": 3, "v4": 4}  # DDTREE_TOPK_IMPL_* of draft_topk_lse.h


def _fns() -> tuple[object, object]:
    size = _lib.function(
        "ddtree_draft_topk_lse_workspace_size", [ctypes.c_int32] * 4, restype=ctypes.c_size_t
    )
    run = _lib.function(
        "ddtree_draft_topk_lse_impl",
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
         ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32],
    )
    return size, run


def resolved_impl(k: int, impl: str = "default") -> str:
    """Which implementation ("v2", "v3" or "v4") a call with this k and choice runs in the loaded library on
    the current CUDA device."""
    fn = _lib.function("ddtree_draft_topk_lse_resolve_impl", [ctypes.c_int32, ctypes.c_int32],
                       restype=ctypes.c_int32)
    return f"v{int(fn(k, IMPLS[impl]))}"  # type: ignore[operator]


def draft_topk_lse(logits: torch.Tensor, k: int, check: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top_lp [B,L,k] f32, top_id [B,L,k] i32, lse [B,L] f32) of logits [B,L,V] (bf16/f32, CUDA).

    No host sync unless check=True, which synchronizes and raises DdtreeDeviceError if any op on this
    device flagged NaN input since the last check."""
    return draft_topk_lse_impl(logits, k, "default", check)


def draft_topk_lse_impl(logits: torch.Tensor, k: int, impl: str, check: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_topk_lse with the implementation chosen per call: "default", "v2", "v3" or "v4" (v4 that
    cannot run, k > 64 or no cluster launch, runs v3; v3 asked for with k > 64 runs v2)."""
    require(impl in IMPLS, f"impl must be one of {sorted(IMPLS)}, got {impl!r}")
    require(logits.dim() == 3, f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    require(logits.dtype in _DTYPES, f"logits must be float32 or bfloat16, got {logits.dtype}")
    require(1 <= k <= MAX_K, f"k must be in [1, {MAX_K}], got {k}")
    batch, positions, vocab = logits.shape
    require(vocab >= 1, "logits must have at least one vocab entry")
    device = cuda_device_of(logits)
    top_lp = torch.empty((batch, positions, k), dtype=torch.float32, device=device)
    top_id = torch.empty((batch, positions, k), dtype=torch.int32, device=device)
    lse = torch.empty((batch, positions), dtype=torch.float32, device=device)
    if batch * positions == 0:
        return top_lp, top_id, lse
    require(logits.stride(-1) == 1, "logits must have unit stride along the vocab dimension (call .contiguous())")
    # Strides of size-1 dimensions are arbitrary in torch; give the library consistent ones.
    row_stride = logits.stride(1) if positions > 1 else vocab
    batch_stride = logits.stride(0) if batch > 1 else positions * row_stride
    require(row_stride >= vocab and batch_stride >= (positions - 1) * row_stride + vocab,
            f"logits rows overlap (strides {logits.stride()}); call .contiguous()")
    size_fn, run_fn = _fns()
    nbytes = int(size_fn(batch, positions, vocab, k))  # type: ignore[operator]
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    flags = error_flags(device)
    with torch.cuda.device(device):
        status = run_fn(  # type: ignore[operator]
            ptr(logits), _DTYPES[logits.dtype], batch, positions, vocab, batch_stride, row_stride, k,
            ptr(top_lp), ptr(top_id), ptr(lse), ptr(workspace), nbytes, ptr(flags), stream_handle(device),
            IMPLS[impl],
        )
    _lib.check(status, "ddtree_draft_topk_lse")
    if check:
        check_errors(device)
    return top_lp, top_id, lse
