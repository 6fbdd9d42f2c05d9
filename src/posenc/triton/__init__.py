"""RoPE kernels for CUDA in Triton (Tillet et al. 2019, "Triton: an intermediate language
and compiler for tiled neural network computations").

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.

``apply_rope(x, cos, sin, *, interleaved=False, inplace=False)`` takes the arguments of
``posenc.apply_rope`` and rotates ``x [B, H, T, D]`` in one pass over memory (read ``x``
once, write the output once), in float32 (float64 for float64 inputs) rounded once to
``x``'s dtype. ``posenc.apply_rope`` calls it for CUDA tensors when Triton imports.

This package is imported lazily and never needs Triton on a CPU: importing it is free,
and only calling ``apply_rope`` imports Triton. The kernels run on CUDA tensors, or on
CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set before the first
call), which is how the test suite checks them without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util

from torch import Tensor

from posenc._checks import check_bool

__all__ = ["apply_rope", "available"]


@functools.cache
def available() -> bool:
    """True when Triton can be imported (checked once; CUDA itself is not checked)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def apply_rope(
    x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False, inplace: bool = False
) -> Tensor:
    """Rotate ``x [B, H, T, D]`` by ``cos``/``sin`` ``[T, R/2] | [B, T, R/2]`` with Triton.

    Args:
        x: queries or keys on a CUDA device (any strides), float64/32/16 or bfloat16.
        cos: cosines of the angles, one per rotated pair; ``R = 2 * cos.shape[-1]``
            features rotate and features ``R..D-1`` pass through (partial rotary).
            ``[B, T, R/2]`` tables serve per-token positions and M-RoPE (whose sections
            the caller gathers into one table).
        sin: sines of the same angles, same shape as ``cos``.
        interleaved: pair layout ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i+R/2])``.
        inplace: rotate ``x`` where it lies and return it.

    Returns:
        The rotated tensor (``x`` itself when ``inplace``), differentiable in ``x``: the
        backward pass is the rotation by ``-theta``, by the same kernel.

    Raises:
        ImportError: Triton is not installed.
        ValueError: mismatched shapes or devices, ``R > D``, a CPU tensor outside the
            interpreter, ``cos``/``sin`` that require grad, or an in-place ``x`` whose
            elements overlap.
        TypeError: non-tensor, non-floating or complex inputs; ``interleaved`` or
            ``inplace`` not a bool (a truthy string would pick a layout silently).
    """
    interleaved = check_bool("interleaved", interleaved)
    inplace = check_bool("inplace", inplace)
    if not available():
        raise ImportError("posenc.triton needs Triton: pip install triton")
    from posenc.triton.rope import rope

    return rope(x, cos, sin, interleaved=interleaved, inplace=inplace)
