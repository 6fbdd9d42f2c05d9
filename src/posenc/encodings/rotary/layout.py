"""Memory-layout checks shared by the rotations that write in place (``apply_rope_`` and
the Triton kernel): whether a tensor's elements may overlap, whether two tensors share a
storage. They sit below both, so ``posenc.triton`` never imports ``apply``."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_no_overlap", "shares_memory"]


def check_no_overlap(x: Tensor, *, hint: str) -> None:
    """Raise ``ValueError`` unless ``x``'s elements provably occupy distinct memory.

    Sorted by stride, each dimension must step past everything the smaller ones reach
    (the test torch itself uses for dense layouts, extended to gaps); a layout that
    fails it may overlap (an expanded tensor, rows that share features) and an in-place
    result on it would depend on the order of the writes.
    """
    if x.numel() == 0:
        return
    dims = sorted(
        (stride, size) for stride, size in zip(x.stride(), x.shape, strict=True) if size > 1
    )
    reach = 0
    for stride, size in dims:
        if stride <= reach:
            raise ValueError(
                f"x (shape {tuple(x.shape)}, strides {x.stride()}) may have overlapping "
                f"elements in memory; {hint}"
            )
        reach += (size - 1) * stride


def shares_memory(a: Tensor, b: Tensor) -> bool:
    """True when ``a`` and ``b`` are views of one storage."""
    if a._is_zerotensor() or b._is_zerotensor():  # no storage at all
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
