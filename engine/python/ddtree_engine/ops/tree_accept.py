"""tree_accept over libddtree (exact semantics and the Gumbel noise: reference/tree_accept.py)."""

from __future__ import annotations

import ctypes
import os

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import (
    arrival_counters, check_errors, cuda_device_of, error_flags, ptr, require, stream_handle,
)
from ddtree_engine.reference.tree_accept import AcceptOutput

MAX_WIDTH = 1024
FUSED_MAX_NODES = 1024  # DDTREE_TREE_ACCEPT_FUSED_MAX_NODES
IMPLS = ("fused", "split")
_DTYPES = {torch.float32: _lib.DTYPE_FLOAT32, torch.bfloat16: _lib.DTYPE_BFLOAT16}

__all__ = ["AcceptOutput", "tree_accept"]


def _fns() -> tuple[object, object]:
    size = _lib.function("ddtree_tree_accept_workspace_size", [ctypes.c_int32] * 3, restype=ctypes.c_size_t)
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    run = _lib.function(
        "ddtree_tree_accept",
        [vp, ctypes.c_int, i32, i32, i32, i64, i64, vp, vp, vp, vp, vp, vp, vp, vp, i32, i32, vp, vp, vp, vp, vp,
         vp, ctypes.c_size_t, vp, vp],
    )
    return size, run


def _fused_fn() -> object:
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    return _lib.function(
        "ddtree_tree_accept_fused",
        [vp, ctypes.c_int, i32, i32, i32, i64, i64, vp, vp, vp, vp, vp, vp, vp, vp, i32, i32, vp, vp, vp, vp, vp,
         vp, ctypes.c_size_t, vp, vp, vp],
    )


def resolved_impl(n_max: int, impl: str | None = None) -> str:
    """The launch plan a call takes: `impl`, else DDTREE_ACCEPT_IMPL, else fused when the tree fits it."""
    choice = impl or os.environ.get("DDTREE_ACCEPT_IMPL") or ""
    require(choice in ("",) + IMPLS, f"tree_accept impl must be one of {IMPLS}, got {choice!r}")
    if choice == "fused":
        require(n_max <= FUSED_MAX_NODES, f"the fused tree_accept takes n_max <= {FUSED_MAX_NODES}, got {n_max}")
    return choice or ("fused" if n_max <= FUSED_MAX_NODES else "split")


def _int_tensor(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.int32) -> None:
    require(tuple(t.shape) == shape, f"{name} must have shape {shape}, got {tuple(t.shape)}")
    require(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    require(t.is_contiguous(), f"{name} must be contiguous")


def launch_args(target_logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor,
                next_sibling: torch.Tensor, num_nodes: torch.Tensor, ctx_len: torch.Tensor, temperature: torch.Tensor,
                seed: torch.Tensor, stop_ids: torch.Tensor, width: int,
                out: AcceptOutput) -> tuple[list[object], int, torch.Tensor | None]:
    """Checks tree_accept's inputs and returns the C arguments shared by ddtree_tree_accept(_fused) and
    ddtree_round_finish (up to and including the workspace size), the size, and the workspace (keep it
    referenced until the launch). Empty batch: no arguments."""
    batch, n_max = node_token.shape
    for name, t in (("node_token", node_token), ("first_child", first_child), ("next_sibling", next_sibling)):
        _int_tensor(t, name, (batch, n_max))
    for name, t in (("num_nodes", num_nodes), ("ctx_len", ctx_len)):
        _int_tensor(t, name, (batch,))
    _int_tensor(temperature, "temperature", (batch,), torch.float32)
    _int_tensor(seed, "seed", (batch,), torch.int64)
    require(stop_ids.dim() == 1 and stop_ids.dtype == torch.int32 and stop_ids.is_contiguous(),
            "stop_ids must be a contiguous 1-D int32 tensor")
    require(target_logits.dtype in _DTYPES, f"target_logits must be float32 or bfloat16, got {target_logits.dtype}")
    if target_logits.dim() == 2:
        require(target_logits.shape[0] == batch * n_max,
                f"target_logits [B*N, V] must have {batch * n_max} rows, got {target_logits.shape[0]}")
        vocab = target_logits.shape[1]
        row_stride = target_logits.stride(0) if target_logits.shape[0] > 1 else vocab
        batch_stride = row_stride * n_max
    else:
        require(target_logits.dim() == 3 and tuple(target_logits.shape[:2]) == (batch, n_max),
                f"target_logits must be [B*N, V] or [B, N, V] with B={batch}, N={n_max}; got {tuple(target_logits.shape)}")
        vocab = target_logits.shape[2]
        row_stride = target_logits.stride(1) if n_max > 1 else vocab
        batch_stride = target_logits.stride(0) if batch > 1 else n_max * row_stride
    require(vocab >= 1 and target_logits.stride(-1) == 1, "target_logits must have unit stride along the vocab")
    require(row_stride >= vocab and batch_stride >= (n_max - 1) * row_stride + vocab,
            f"target_logits rows overlap (strides {target_logits.stride()}); call .contiguous()")
    device = cuda_device_of(target_logits, node_token, first_child, next_sibling, num_nodes, ctx_len, temperature,
                            seed, stop_ids)
    if batch == 0:
        return [], 0, None
    size_fn, _ = _fns()
    nbytes = int(size_fn(batch, n_max, vocab))  # type: ignore[operator]
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    args = [
        ptr(target_logits), _DTYPES[target_logits.dtype], batch, n_max, vocab, batch_stride, row_stride,
        ptr(node_token), ptr(first_child), ptr(next_sibling), ptr(num_nodes), ptr(ctx_len), ptr(temperature),
        ptr(seed), ptr(stop_ids) if stop_ids.numel() else None, stop_ids.numel(), width - 1,
        ptr(out.accept_nodes), ptr(out.accept_len), ptr(out.committed_ids), ptr(out.bonus), ptr(out.finished),
        ptr(workspace), nbytes,
    ]
    return args, nbytes, workspace


def tree_accept(target_logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor,
                next_sibling: torch.Tensor, num_nodes: torch.Tensor, ctx_len: torch.Tensor,
                temperature: torch.Tensor, seed: torch.Tensor, stop_ids: torch.Tensor,
                max_depth: int | None = None, check: bool = False) -> AcceptOutput:
    """Accept along each request's tree; target_logits [B*N, V] or [B, N, V] (bf16/f32, unit vocab stride).

    Output width W = max_depth + 1 (default N; at most 1024). No host sync unless check=True. The fused plan
    above V = 1024 skips leaf rows the walk does not end on (DDTREE_ACCEPT_LEAF; a NaN there raises nothing)."""
    require(node_token.dim() == 2, f"node_token must be [B, N], got shape {tuple(node_token.shape)}")
    batch, n_max = node_token.shape
    width = n_max if max_depth is None else max_depth + 1
    require(1 <= width <= MAX_WIDTH, f"max_depth + 1 must be in [1, {MAX_WIDTH}], got {width}")
    device = node_token.device
    out = AcceptOutput(
        accept_nodes=torch.empty((batch, width), dtype=torch.int32, device=device),
        accept_len=torch.empty((batch,), dtype=torch.int32, device=device),
        committed_ids=torch.empty((batch, width), dtype=torch.int32, device=device),
        bonus=torch.empty((batch,), dtype=torch.int32, device=device),
        finished=torch.empty((batch,), dtype=torch.int32, device=device),
    )
    args, _, workspace = launch_args(target_logits, node_token, first_child, next_sibling, num_nodes, ctx_len,
                                     temperature, seed, stop_ids, width, out)
    if batch == 0:
        return out
    device = cuda_device_of(node_token)
    flags = error_flags(device)
    _, run_fn = _fns()
    fused = resolved_impl(n_max) == "fused"
    with torch.cuda.device(device):
        if fused:
            counters = arrival_counters("tree_accept", device, batch)
            status = _fused_fn()(*args, ptr(counters), ptr(flags), stream_handle(device))  # type: ignore[operator]
        else:
            status = run_fn(*args, ptr(flags), stream_handle(device))  # type: ignore[operator]
    _lib.check(status, "ddtree_tree_accept_fused" if fused else "ddtree_tree_accept")
    if check:
        check_errors(device)
    return out
