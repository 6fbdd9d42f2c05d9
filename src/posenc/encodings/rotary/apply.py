"""Applying a rotary embedding: rotate feature pairs of ``x`` by precomputed angles
(Su et al. 2021, "RoFormer", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim (even,
``R <= D``). ``x`` is ``[B, H, T, D]``; ``cos`` and ``sin`` hold one value per rotated
pair, ``[T, R/2]`` (shared by the batch) or ``[B, T, R/2]`` (per-sequence positions).
The rotary dim is implied by them: ``R = 2 * cos.shape[-1]``, and features ``R..D-1``
pass through unchanged (partial rotary).

Layouts of the pairs ``(a_i, b_i)``, ``i < R/2``, that rotate by angle ``theta_i``:

* half-split (``interleaved=False``; GPT-NeoX, Llama in Hugging Face):
  ``a_i = x[i]``, ``b_i = x[i + R/2]``;
* interleaved (``interleaved=True``; GPT-J, Meta's Llama): ``a_i = x[2i]``, ``b_i = x[2i+1]``.

Each pair maps to ``(a cos - b sin, a sin + b cos)``.

Speed: the rotation is pure memory traffic. On CPU tensors (any strides) it runs in
the compiled kernel of ``posenc.encodings.rotary.cpu_kernel`` (one pass, each row read
once and written once, rows shared among threads in small blocks, so a busy core delays
it by one block). Elsewhere, or where the kernel is not built, the PyTorch path
(``rope_torch``) gives the same bits in a few passes per cache-sized chunk of positions,
never allocating a full-size temporary. Precision, on both paths: float32/float64 inputs
are rotated in their own dtype; float16/bfloat16 inputs are rotated in float32 and
rounded once (the float32 result rounded to ``x``'s dtype). The backward pass is the
rotation by ``-theta``, through the same kernels, and is itself differentiable (second
derivatives, ``create_graph=True``).

Under ``torch.compile`` and ``torch.export`` a CPU rotation is the custom op
``torch.ops.posenc.rope`` (``rope_op``: one node, no graph break, the kernel's bits;
``apply_rope_`` is that node and one ``copy_`` into ``x``, so tables that share ``x``'s
memory are read before it is written); elsewhere the plain expression is traced (the
compiler fuses it into one kernel). The
plain expression also serves learned angles (``cos``/``sin`` that require grad),
forward-mode AD and ``torch.func`` transforms (``vmap``, ``jvp``, ``grad``), which see
its tensors, not raw memory, compiled or not (the op has no forward-mode formula and
``torch.func.grad`` cannot enter it).

What the kernels cannot see is resolved or refused before they touch memory: a lazy
negation bit or an efficient zero tensor is resolved; sparse and other non-strided
layouts are refused (``TypeError``); an in-place ``x`` whose elements may overlap is
refused (``ValueError``), and tables that share ``x``'s memory are copied first, so the
rotation is by the angles as they were passed.

Fresh outputs are plain ``torch.empty_like`` (4 KiB pages). Huge pages
(``posenc.fastpath.empty_like``) halve the median cost of first touching them, but on
virtual machines that hand free 2 MiB blocks back to the host (free page reporting)
their faults stall now and then for tens of times a copy; ``posenc bench`` shows both.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor

from posenc import triton as posenc_triton
from posenc._checks import check_bool, check_tensor
from posenc.encodings.rotary import rope_op
from posenc.encodings.rotary.layout import check_no_overlap, shares_memory
from posenc.encodings.rotary.rope_op import compute_dtype, rotate_into, rotation_function

__all__ = ["apply_rope", "apply_rope_", "check_no_overlap", "shares_memory"]


def check_dense(name: str, t: Tensor) -> None:
    """Refuse a sparse or nested tensor (the rotations read strided memory)."""
    if t.layout != torch.strided or t.is_nested:
        layout = "nested" if t.is_nested else t.layout
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {layout}")


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> int:
    """Validate shapes; return the rotary dim ``R``."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_tensor(name, t)
        check_dense(name, t)
    if x.dim() != 4:
        raise ValueError(f"x must have 4 dimensions, got shape {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() not in (2, 3):
            raise ValueError(f"{name} must have 2 or 3 dimensions, got shape {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device}/{sin.device} but x is on {x.device}")
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"cos/sin rotate {rotary_dim} features but x has head_dim {x.shape[-1]}")
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin cover {cos.shape[-2]} positions but x has T={x.shape[-2]}")
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[0]}")
    return rotary_dim


_Rope = rotation_function(
    lambda out, x, cos, sin, interleaved, inverse: rotate_into(
        out, x, cos, sin, interleaved=interleaved, inverse=inverse
    )
)


def _rotate_differentiable(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The plain expression, differentiable in ``cos`` and ``sin`` too (learned angles).

    Computed in ``compute_dtype(x.dtype)`` and rounded once, like the fast kernels.
    """
    rotary_dim = 2 * cos.shape[-1]
    if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    dtype = compute_dtype(x.dtype)
    cos, sin = cos.to(dtype), sin.to(dtype)
    if interleaved:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    else:
        a, b = x[..., : rotary_dim // 2], x[..., rotary_dim // 2 : rotary_dim]
    a, b = a.to(dtype), b.to(dtype)
    new_a, new_b = (a * cos - b * sin).to(x.dtype), (a * sin + b * cos).to(x.dtype)
    if interleaved:
        rotated = torch.stack((new_a, new_b), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((new_a, new_b), dim=-1)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _transformed(*tensors: Tensor) -> bool:
    """Tensors that carry forward-mode tangents or sit inside ``torch.func`` transforms."""
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
        return True
    return forward_ad._current_level >= 0 and any(
        forward_ad.unpack_dual(t).tangent is not None for t in tensors
    )


def _route(x: Tensor, cos: Tensor, sin: Tensor) -> str:
    """``"plain"`` expression, the custom ``"op"`` (compiled graphs on CPU), or ``"eager"``."""
    if torch.compiler.is_compiling():
        # the op has no forward-mode formula and torch.func.grad cannot enter it (both
        # checks are readable while compiling, unlike the tensors' wrappers)
        functorch = torch._C._are_functorch_transforms_active()
        transformed = functorch or forward_ad._current_level >= 0
        cpu = x.device.type == "cpu"
        return "op" if cpu and not (transformed or _needs_grad(cos, sin)) else "plain"
    if _needs_grad(cos, sin) or _transformed(x, cos, sin):
        return "plain"
    return "eager"


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate ``x [B, H, T, D]`` by ``cos``/``sin`` ``[T, R/2] | [B, T, R/2]``.

    Args:
        x: queries or keys, any strides (e.g. a transposed ``[B, T, H, D]`` projection).
        cos: cosines of the angles, one per rotated pair (float32-or-better from
            ``RotaryEmbedding``); ``R = 2 * cos.shape[-1]`` features rotate (``R = 0``:
            ``x`` is copied unchanged).
        sin: sines of the same angles, same shape as ``cos``.
        interleaved: pair layout, ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i+R/2])``.

    Returns:
        A new tensor of ``x``'s shape and dtype (and strides, when ``x`` is dense);
        ``x`` is not modified. Computed in ``x``'s dtype with ``cos``/``sin`` cast to it;
        float16/bfloat16 inputs in float32, rounded once.
        Differentiable in ``x`` (backward: the inverse rotation), and in ``cos``/``sin``
        when they require grad; forward-mode AD and ``torch.func`` transforms work.

    Raises:
        ValueError: mismatched shapes or devices, or ``R > D``.
        TypeError: non-tensor, non-floating, complex, sparse or nested inputs.
    """
    _check(x, cos, sin)
    return rotate_checked(x, cos, sin, check_bool("interleaved", interleaved))


def rotate_checked(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """``apply_rope`` after its checks, for a caller that checked ``x`` (4-D, floating,
    dense) and built ``cos``/``sin`` for it (``RotaryEmbedding``)."""
    route = _route(x, cos, sin)
    if route == "plain":
        return _rotate_differentiable(x, cos, sin, interleaved)
    if route == "op":
        return rope_op.rope(x, cos, sin, interleaved, False)
    if x.is_cuda and posenc_triton.available():  # one Triton kernel (posenc.triton)
        return posenc_triton.apply_rope(x, cos, sin, interleaved=interleaved)
    if _needs_grad(x):
        return _Rope.apply(x, cos, sin, interleaved, False, False)
    out = torch.empty_like(x)
    rotate_into(out, x, cos, sin, interleaved=interleaved, inverse=False)
    return out


def apply_rope_(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """In-place ``apply_rope``: rotate ``x`` where it lies and return it.

    Same arguments, shapes and numerics as ``apply_rope``; ``cos``/``sin`` that share
    ``x``'s memory are read as they were before the call. Autograd follows the usual
    in-place rules (``x`` must not be a leaf that requires grad).

    Raises:
        ValueError: mismatched shapes or devices, ``R > D``, an ``x`` whose elements
            overlap or may overlap in memory (an expanded tensor, rows sharing
            features), or an efficient zero tensor (immutable; under ``torch.compile``
            torch's own ``RuntimeError``).
        TypeError: non-tensor, non-floating, complex, sparse or nested inputs.
    """
    _check(x, cos, sin)
    interleaved = check_bool("interleaved", interleaved)
    # eager only: asking a traced tensor breaks the graph (a compiled graph's write into
    # a zero tensor is refused by torch itself, a RuntimeError)
    if not torch.compiler.is_compiling() and x._is_zerotensor():
        raise ValueError("x is an efficient zero tensor, which is immutable; use apply_rope")
    check_no_overlap(x, hint="rotate a copy with apply_rope instead")
    route = _route(x, cos, sin)
    # these two rotate out of place, then write x: the tables are read before the write
    if route == "plain":
        # the rotation reads a copy: x itself is overwritten, and autograd needs its values
        return x.copy_(_rotate_differentiable(x.clone(), cos, sin, interleaved))
    if route == "op":
        return x.copy_(rope_op.rope(x, cos, sin, interleaved, False))
    # the kernels below write x while they read the tables (eager only: no fake tensors)
    if shares_memory(x, cos):
        cos = cos.clone()
    if shares_memory(x, sin):
        sin = sin.clone()
    if x.is_cuda and posenc_triton.available():
        return posenc_triton.apply_rope(x, cos, sin, interleaved=interleaved, inplace=True)
    if _needs_grad(x):
        return _Rope.apply(x, cos, sin, interleaved, True, False)
    rotate_into(x, x, cos, sin, interleaved=interleaved, inverse=False)
    return x
