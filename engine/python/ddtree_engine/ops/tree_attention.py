"""Torch wrapper of libddtree's tree_attention kernel (same signature as the reference).

Semantics: see ``ddtree_engine/reference/tree_attention.py`` and ``include/ddtree/tree_attention.h``.
The op returns ``o`` in bf16 and ``lse`` (natural log) in float32. It never synchronizes the host: the
split plan depends only on shapes (and ``kv_chunk``). The workspace of split plans (arrival counters,
then fp32 partials) is cached per (device, stream, counter bytes), zero-filled when it is allocated and
grown when a plan needs more. Only the opt-in fused merge of the fa3 back end (DDTREE_TA_FA3_FUSED_MERGE=1)
reads the counters, and it leaves them zero after every launch; plans with the same counter bytes keep
their counters in the same bytes, so no partials ever land where another plan expects a zero counter. Warm the op up once on the stream that will be captured before capturing
it in a CUDA graph, so that the workspace exists outside the capture.
"""
from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import torch
from torch import Tensor

from ddtree_engine import _lib
from ddtree_engine.ops._common import cuda_device_of, ptr, require, stream_handle

_workspaces: dict[tuple[int, int, int], Tensor] = {}

# Back ends (DDTREE_TA_IMPL_* in tree_attention.h). "auto" = the default: fa3 where the library has
# sm_90a code and the GPU is compute capability 9.0 (D = 128), else mma.sync. "wgmma" on request.
IMPLS = {"auto": 0, "mma": 1, "wgmma": 2, "fa3": 3}
_IMPL_NAMES = {v: k for k, v in IMPLS.items()}


def set_impl(name: str) -> None:
    """Select the back end for every later launch in this process ("auto" restores the default)."""
    if name not in IMPLS:
        raise ValueError(f"tree_attention: unknown back end {name!r} (one of {sorted(IMPLS)})")
    fn = _lib.function("ddtree_tree_attention_set_impl", [ctypes.c_int])
    _lib.check(fn(IMPLS[name]), "tree_attention set_impl")


def impl_available(name: str, head_dim: int = 128) -> bool:
    """True iff back end `name` can run `head_dim` on the current device with the loaded library."""
    fn = _lib.function("ddtree_tree_attention_impl_available", [ctypes.c_int, ctypes.c_int])
    return name in IMPLS and name != "auto" and bool(fn(IMPLS[name], head_dim))


def impl_for(head_dim: int = 128) -> str:
    """Name of the back end a launch with this head_dim uses now."""
    fn = _lib.function("ddtree_tree_attention_impl_for", [ctypes.c_int])
    return _IMPL_NAMES.get(int(fn(head_dim)), "auto")


def available_impls(head_dim: int = 128) -> list[str]:
    """Back ends that can run here, in the order mma, wgmma, fa3."""
    return [n for n in ("mma", "wgmma", "fa3") if impl_available(n, head_dim)]


@contextlib.contextmanager
def use_impl(name: str) -> Iterator[None]:
    """Run the block with back end `name` selected; restores the default afterwards."""
    set_impl(name)
    try:
        yield
    finally:
        set_impl("auto")

_PLAN_ARGS = [ctypes.c_int] * 8
_INPUTS_READY = 1  # DDTREE_TA_INPUTS_READY


def _fn_launch() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    return _lib.function(
        "ddtree_tree_attention_ex",
        [ctypes.c_void_p] * 9
        + [ctypes.c_int] * 9
        + [ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
           ctypes.c_uint],
    )


def plan_args(q: Tensor, k_cache: Tensor, block_table: Tensor, n_max: int, kv_chunk: int) -> list[int]:
    return [block_table.shape[0], q.shape[1], k_cache.shape[2], q.shape[2], n_max,
            block_table.shape[1], k_cache.shape[1], kv_chunk]


def workspace_size(args: list[int]) -> int:
    """Bytes of fp32 partials the plan needs (0 when it splits nothing); ValueError on bad shapes."""
    fn = _lib.function("ddtree_tree_attention_workspace_size", _PLAN_ARGS, ctypes.c_size_t)
    chunk = plan_chunk(args)  # validates the shapes (0 bytes is a valid workspace size)
    del chunk
    return int(fn(*args))


def workspace_counter_bytes(args: list[int]) -> int:
    """Bytes at the start of the workspace that must be zero before a launch (its arrival counters)."""
    fn = _lib.function("ddtree_tree_attention_workspace_counter_bytes", _PLAN_ARGS, ctypes.c_size_t)
    return int(fn(*args))


def plan_chunk(args: list[int]) -> int:
    """Chunk size (keys) the kernel splits the key range into for these plan inputs."""
    fn = _lib.function("ddtree_tree_attention_plan_chunk", _PLAN_ARGS, ctypes.c_int)
    chunk = int(fn(*args))
    if chunk == 0:
        raise ValueError(f"tree_attention: {_lib.last_error()}")
    return chunk


def _workspace(device: torch.device, nbytes: int, counter_bytes: int) -> Tensor:
    key = (device.index or 0, torch.cuda.current_stream(device).cuda_stream, counter_bytes)
    buf = _workspaces.get(key)
    if buf is None or buf.numel() < nbytes:
        buf = torch.zeros(max(nbytes, 256), dtype=torch.uint8, device=device)  # counters start at zero
        _workspaces[key] = buf
    return buf


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    block_table: Tensor,
    ctx_len: Tensor,
    anc: Tensor | None,
    sm_scale: float,
    *,
    kv_chunk: int = 0,
    inputs_ready: bool = False,
) -> tuple[Tensor, Tensor]:
    """o [T, Hq, D] bf16, lse [T, Hq] f32. ``anc=None``: causal (chain) mode.

    ``inputs_ready=True`` promises that the CUDA kernel launched right before this call (on the current stream)
    does not write qo_indptr, ctx_len, block_table or anc, so the fa3 back end may read them while that kernel
    still runs (programmatic dependent launch; DDTREE_TA_INPUTS_READY in tree_attention.h). Same results
    either way; a broken promise reads stale values."""
    tensors = [q, k_cache, v_cache, qo_indptr, block_table, ctx_len] + ([] if anc is None else [anc])
    device = cuda_device_of(*tensors)
    require(q.dim() == 3, f"q must be [T, Hq, D], got shape {tuple(q.shape)}")
    t_total, hq, d = q.shape
    require(k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
            f"k_cache/v_cache must both be [P, page, Hkv, D], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    require(k_cache.shape[3] == d, f"cache head_dim {k_cache.shape[3]} != q head_dim {d}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        require(t.dtype == torch.bfloat16, f"{name} must be bfloat16, got {t.dtype}")
        require(t.is_contiguous(), f"{name} must be contiguous")
    bsz = block_table.shape[0] if block_table.dim() == 2 else -1
    require(block_table.dim() == 2, f"block_table must be [B, max_pages], got {tuple(block_table.shape)}")
    require(qo_indptr.shape == (bsz + 1,), f"qo_indptr must be [B+1] = [{bsz + 1}], got {tuple(qo_indptr.shape)}")
    require(ctx_len.shape == (bsz,), f"ctx_len must be [B] = [{bsz}], got {tuple(ctx_len.shape)}")
    for name, t in (("qo_indptr", qo_indptr), ("block_table", block_table), ("ctx_len", ctx_len)):
        require(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")
        require(t.is_contiguous(), f"{name} must be contiguous")
    if anc is None:
        n_max = max(1, t_total)
    else:
        require(anc.dim() == 3 and anc.shape[0] == bsz and anc.shape[2] == (anc.shape[1] + 31) // 32,
                f"anc must be [B, N, ceil(N/32)] with B={bsz}, got {tuple(anc.shape)}")
        require(anc.dtype == torch.int32 and anc.is_contiguous(), "anc must be contiguous int32")
        n_max = anc.shape[1]
    require(sm_scale > 0, f"sm_scale must be > 0, got {sm_scale}")

    o = torch.empty_like(q)
    lse = torch.empty(t_total, hq, dtype=torch.float32, device=device)
    args = plan_args(q, k_cache, block_table, n_max, kv_chunk)
    ws = _workspace(device, workspace_size(args), workspace_counter_bytes(args))
    status = _fn_launch()(
        ptr(q), ptr(k_cache), ptr(v_cache), ptr(qo_indptr), ptr(block_table), ptr(ctx_len), ptr(anc),
        ptr(o), ptr(lse),
        t_total, bsz, hq, k_cache.shape[2], d, k_cache.shape[0], k_cache.shape[1], block_table.shape[1],
        n_max, float(sm_scale), kv_chunk, _lib.DTYPE_BFLOAT16, ptr(ws), ws.numel(), stream_handle(device),
        _INPUTS_READY if inputs_ready else 0,
    )
    _lib.check(status, "tree_attention")
    return o, lse
