"""Memory-traffic helpers for the elementwise hot paths (RoPE, additive encodings).

Positional work is elementwise: its floor is one read of the input and one write of the
output. Two things keep eager PyTorch far from that floor on a CPU, and this module
removes both:

* **Fresh allocations.** A large new tensor is backed by fresh pages of memory, and the
  kernel faults them in 4 KiB at a time on first touch; that costs several times the
  copy itself. ``empty_like`` asks the kernel for transparent huge pages on the new
  buffer (``madvise(MADV_HUGEPAGE)``, Linux only, large CPU tensors only), which makes
  a fresh output cost about as much as a reused one in the median. Nothing else
  changes: the memory is freed with the tensor as usual. On a virtual machine whose
  free 2 MiB blocks are handed back to the host (free page reporting), some of those
  faults stall for much longer, which is why ``apply_rope`` does not use it.
* **Temporaries.** An expression such as ``x * cos + rotate_half(x) * sin`` writes four
  full-size temporaries. Writing each partial result into the output (``out=``) in
  chunks that stay in the cache (``chunks``) touches main memory once per tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import torch
from torch import Tensor

__all__ = ["CHUNK_BYTES", "add", "chunks", "empty_like"]

#: Bytes per chunk of a multi-pass kernel (input and scratch together): the passes over
#: one chunk then hit the L2/L3 cache instead of main memory. Larger chunks mean fewer
#: kernel launches (each a thread-pool barrier), which matters more on a busy machine.
CHUNK_BYTES = 4 << 20

_HUGE_PAGE = 2 << 20  # 2 MiB, the x86-64 and arm64 transparent huge page size
_MADV_HUGEPAGE = 14  # from <sys/mman.h> on Linux


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    """``madvise`` from the C library, or ``None`` where it is unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    func = libc.madvise
    func.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    func.restype = ctypes.c_int
    return func


def _advise_huge_pages(t: Tensor) -> None:
    """Ask for huge pages on the whole 2 MiB pages inside ``t``'s storage (best effort)."""
    madvise = _madvise()
    nbytes = t.untyped_storage().nbytes()
    if madvise is None or nbytes < 4 * _HUGE_PAGE:
        return
    start = t.untyped_storage().data_ptr()
    first = -(-start // _HUGE_PAGE) * _HUGE_PAGE  # round up, stay inside the storage
    last = (start + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if last > first:
        madvise(first, last - first, _MADV_HUGEPAGE)  # a refusal only costs speed


def empty_like(x: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
    """``torch.empty_like(x)`` (same strides when ``x`` is dense) that is cheap to fill.

    On Linux CPU tensors of 8 MiB or more, the new storage is advised to use huge pages
    before anything touches it, so filling it costs about a copy instead of several.
    """
    out = torch.empty_like(x, dtype=dtype)
    if out.device.type == "cpu":
        _advise_huge_pages(out)
    return out


class _Add(torch.autograd.Function):
    """``x + y`` into a fresh ``empty_like(x)``; ``y`` broadcasts to ``x``."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor) -> Tensor:  # type: ignore[override]
        ctx.y_shape = y.shape
        return torch.add(x, y, out=empty_like(x))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        return grad, grad.sum_to_size(ctx.y_shape)


def add(x: Tensor, y: Tensor) -> Tensor:
    """``x + y`` as one pass into a cheap fresh output (``empty_like``), differentiable.

    The additive encodings' ``x [B, T, C] + PE [T, C] | [B, T, C]``. Falls back to the
    plain ``x + y`` when ``y`` does not broadcast to ``x``'s shape or has another dtype.
    """
    if x.dtype != y.dtype or torch.broadcast_shapes(x.shape, y.shape) != x.shape:
        return x + y
    return _Add.apply(x, y)


def chunks(length: int, bytes_per_step: int, *, target: int | None = None) -> list[slice]:
    """Split ``range(length)`` into slices of about ``target`` bytes each.

    Args:
        length: the size of the dimension being split.
        bytes_per_step: bytes of data under one index of that dimension.
        target: wanted bytes per chunk (at least one index per chunk); default
            ``CHUNK_BYTES``, read when called.

    Returns:
        Consecutive slices covering ``0 .. length - 1``; one slice when it all fits.
    """
    target = CHUNK_BYTES if target is None else target
    step = max(1, target // max(1, bytes_per_step))
    return [slice(i, min(i + step, length)) for i in range(0, length, step)]
