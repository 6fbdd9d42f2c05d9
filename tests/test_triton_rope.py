"""posenc.triton.apply_rope under Triton's interpreter on CPU tensors, against the float64
reference: both layouts, partial rotary, ``[T]`` and ``[B, T]`` tables, memory layouts,
in place and not, forward and backward, and its bad inputs.

The kernel is defined when ``posenc.triton.rope`` is imported, so the fixture imports it
afresh with ``TRITON_INTERPRET=1`` and removes it (and the variable) afterwards: no other
test, and no CUDA run, sees an interpreted kernel.
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys

import pytest
import torch

from conftest import tolerances
from posenc.reference.rope_apply_ref import rope_apply_backward_ref, rope_apply_ref

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

B, H, T, D = 2, 3, 11, 16
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def rope():
    """``posenc.triton.rope.rope`` built under the interpreter, for this module only."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    sys.modules.pop("posenc.triton.rope", None)
    try:
        yield importlib.import_module("posenc.triton.rope").rope
    finally:
        sys.modules.pop("posenc.triton.rope", None)
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _tables(gen, rotary_dim, table, dtype):
    """cos/sin of random angles, ``[T, R/2]``, ``[B, T, R/2]`` or ``[1, T, R/2]``."""
    shape = {"T": (T,), "BT": (B, T), "1T": (1, T)}[table] + (rotary_dim // 2,)
    angles = 20 * torch.rand(shape, generator=gen, dtype=torch.float64) - 10
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return angles.cos().to(work), angles.sin().to(work)


def _x(gen, dtype, layout):
    """``x [B, H, T, D]`` contiguous, as a transposed projection, or every other feature."""
    if layout == "contiguous":
        x = torch.randn(B, H, T, D, generator=gen)
    elif layout == "projection":
        x = torch.randn(B, T, H, D, generator=gen).transpose(1, 2)
    else:
        x = torch.randn(B, H, T, 2 * D + 1, generator=gen)[..., 1::2]
    return x.to(dtype)


def _ref(x, cos, sin, interleaved, backward=False):
    fn = rope_apply_backward_ref if backward else rope_apply_ref
    args = (x.double().numpy(), cos.double().numpy(), sin.double().numpy())
    return torch.from_numpy(fn(*args, interleaved=interleaved))


def _check_rounded_once(out, expected, dtype):
    """``out`` is the float64 result rounded once to ``dtype`` (plus float32 math error).

    Half a unit in the last place of ``dtype``, except bfloat16, where the interpreter
    truncates float32 -> bfloat16 (numpy has no bfloat16; a GPU rounds to nearest): one
    unit there. The float32 math adds a few float32 epsilons of the operands' size.
    """
    _, exponent = torch.frexp(expected)
    ulp = torch.finfo(dtype).eps * torch.exp2(exponent.double() - 1)
    units = 1.0 if dtype == torch.bfloat16 else 0.5
    math = (
        8 * torch.finfo(torch.float32).eps * (expected.abs() + 1) if dtype != torch.float64 else 0
    )
    assert bool(((out.double() - expected).abs() <= units * ulp + math).all())


CASES = list(
    itertools.product(
        DTYPES, [False, True], [D, 10], ["T", "BT", "1T"], ["contiguous", "projection", "strided"]
    )
)


@pytest.mark.parametrize("dtype,interleaved,rotary_dim,table,layout", CASES)
def test_matches_reference(rope, gen, dtype, interleaved, rotary_dim, table, layout):
    x = _x(gen, dtype, layout)
    cos, sin = _tables(gen, rotary_dim, table, dtype)
    before = x.clone()
    expected = _ref(x, cos, sin, interleaved)

    out = rope(x, cos, sin, interleaved=interleaved, inplace=False)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(x, before), "apply_rope modified its input"
    _check_rounded_once(out, expected, dtype)

    result = rope(x, cos, sin, interleaved=interleaved, inplace=True)
    assert result is x
    _check_rounded_once(x, expected, dtype)


@pytest.mark.parametrize(
    "interleaved,rotary_dim,table", list(itertools.product([False, True], [D, 10], ["T", "BT"]))
)
@pytest.mark.parametrize("inplace", [False, True])
def test_backward_matches_reference(rope, gen, interleaved, rotary_dim, table, inplace):
    leaf = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(gen, rotary_dim, table, torch.float64)
    x = leaf * 1.0 if inplace else leaf  # in place needs a non-leaf
    grad = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    out = rope(x, cos, sin, interleaved=interleaved, inplace=inplace)
    out.backward(grad)
    expected = _ref(grad, cos, sin, interleaved, backward=True)
    torch.testing.assert_close(leaf.grad, expected, **tolerances(torch.float64))


@pytest.mark.parametrize("interleaved", [False, True])
def test_twice_differentiable(rope, gen, interleaved):
    """The backward is itself a rotation (by -theta), so second derivatives exist."""
    x = torch.randn(1, 2, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(gen, 4, "T", torch.float64)
    cos, sin = cos[:5], sin[:5]
    fn = lambda t: rope(t, cos, sin, interleaved=interleaved, inplace=False)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_in_low_precision(rope, gen, dtype):
    x = torch.randn(B, H, T, D, generator=gen).to(dtype).requires_grad_()
    cos, sin = _tables(gen, 10, "BT", dtype)
    grad = torch.randn(B, H, T, D, generator=gen).to(dtype)
    rope(x, cos, sin, interleaved=False, inplace=False).backward(grad)
    _check_rounded_once(x.grad, _ref(grad, cos, sin, False, backward=True), dtype)


def test_long_rows_span_several_blocks(rope, gen):
    """More positions than one program's tile: blocks of positions, the last one partial."""
    x = torch.randn(1, 2, 700, 64, generator=gen)
    angles = torch.rand(700, 32, generator=gen, dtype=torch.float64) * 100
    cos, sin = angles.cos().float(), angles.sin().float()
    _check_rounded_once(
        rope(x, cos, sin, interleaved=True, inplace=False), _ref(x, cos, sin, True), torch.float32
    )


def test_empty_input(rope):
    x = torch.empty(2, 3, 0, 8)
    table = torch.empty(0, 4)
    assert rope(x, table, table, interleaved=False, inplace=False).shape == x.shape


def test_bad_inputs(rope):
    x = torch.randn(B, H, T, D)
    cos = torch.ones(T, D // 2)
    with pytest.raises(ValueError, match="rotate 18 features"):
        rope(x, torch.ones(T, 9), torch.ones(T, 9), interleaved=False, inplace=False)
    with pytest.raises(ValueError, match="cover 5 positions"):
        rope(x, torch.ones(5, 4), torch.ones(5, 4), interleaved=False, inplace=False)
    with pytest.raises(ValueError, match="batch 3"):
        rope(x, torch.ones(3, T, 4), torch.ones(3, T, 4), interleaved=False, inplace=False)
    with pytest.raises(ValueError, match="differ in shape"):
        rope(x, cos, cos[:, :4], interleaved=False, inplace=False)
    with pytest.raises(TypeError, match="int64"):
        rope(x.long(), cos, cos, interleaved=False, inplace=False)
    with pytest.raises(ValueError, match="require grad"):
        rope(x, cos.requires_grad_(), torch.ones(T, D // 2), interleaved=False, inplace=False)
    with pytest.raises(ValueError, match="overlapping"):
        rope(
            x[:, :1].expand(B, H, T, D),
            torch.ones(T, 8),
            torch.ones(T, 8),
            interleaved=False,
            inplace=True,
        )


def test_public_entry_point(rope, gen):
    """``posenc.triton.apply_rope`` reaches the same kernel (the one built in the fixture)."""
    import posenc.triton

    x = torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen, D, "T", torch.float32)
    out = posenc.triton.apply_rope(x, cos, sin, interleaved=True)
    _check_rounded_once(out, _ref(x, cos, sin, True), torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_apply_rope_dispatches_cuda_tensors(gen):
    """``posenc.apply_rope`` on CUDA tensors matches the reference (through Triton)."""
    import posenc

    x = torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen, 10, "BT", torch.float32)
    out = posenc.apply_rope(x.cuda(), cos.cuda(), sin.cuda())
    _check_rounded_once(out.cpu(), _ref(x, cos, sin, False), torch.float32)
