"""Helpers shared by the torch wrappers in ops/: argument checks, the current stream, and the
per-device error-flag word that kernels OR DDTREE_FLAG_* bits into (read only when the caller syncs)."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib

_flags: dict[int, torch.Tensor] = {}
_counters: dict[tuple[str, int], torch.Tensor] = {}


def require(cond: bool, message: str) -> None:
    """Argument check: raise ValueError(message) when cond is false."""
    if not cond:
        raise ValueError(message)


def require_vectors(batch: int, dtype: torch.dtype, **tensors: torch.Tensor | None) -> None:
    """Argument check: every tensor given (None skipped) is a contiguous [batch] tensor of `dtype`."""
    for name, t in tensors.items():
        if t is not None:
            require(tuple(t.shape) == (batch,) and t.dtype == dtype and t.is_contiguous(),
                    f"{name} must be a contiguous [{batch}] {dtype} tensor")


def cuda_device_of(*tensors: torch.Tensor) -> torch.device:
    """The one CUDA device all tensors live on (ValueError otherwise); loads/checks the library for it."""
    dev = tensors[0].device
    require(dev.type == "cuda", f"expected CUDA tensors, got a tensor on {dev}")
    for t in tensors[1:]:
        require(t.device == dev, f"all tensors must be on {dev}, got one on {t.device}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        _lib.ensure_device(index)
    return torch.device("cuda", index)


def stream_handle(device: torch.device) -> ctypes.c_void_p:
    """cudaStream_t of torch's current stream on `device` (what the launchers run on)."""
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def _cuda_device(device: torch.device | int | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def error_flags(device: torch.device | int | None = None) -> torch.Tensor:
    """The int32 device word that ops on `device` OR error bits into (allocated once per device)."""
    dev = _cuda_device(device)
    assert dev.index is not None
    flags = _flags.get(dev.index)
    if flags is None:
        flags = torch.zeros(1, dtype=torch.int32, device=dev)
        _flags[dev.index] = flags
    return flags


def arrival_counters(op: str, device: torch.device, batch: int) -> torch.Tensor:
    """At least `batch` int32 arrival counters for `op` on `device` (kernels that find each request's last
    CTA with them leave them zero after every launch, so they are zeroed once, when allocated, and reused).
    Allocated on first use: warm the op up before capturing a CUDA graph. Calls of one op on one device
    must not overlap on different streams."""
    assert device.index is not None
    buf = _counters.get((op, device.index))
    if buf is None or buf.numel() < batch:
        buf = torch.zeros(max(batch, 64), dtype=torch.int32, device=device)
        _counters[(op, device.index)] = buf
    return buf


def check_errors(device: torch.device | int | None = None) -> None:
    """Synchronize with `device`'s error word, clear it, and raise DdtreeDeviceError if a kernel set a bit."""
    flags = error_flags(device)
    value = int(flags.item())  # the sync: callers choose when to pay for it
    if value:
        flags.zero_()
        what = []
        if value & _lib.FLAG_NAN_INPUT:
            what.append("NaN in input logits")
        if value & _lib.FLAG_BAD_INDEX:
            what.append("out-of-range index in a device tensor")
        raise _lib.DdtreeDeviceError(_lib.INTERNAL, f"device error flags 0x{value:x}: {', '.join(what)}")
