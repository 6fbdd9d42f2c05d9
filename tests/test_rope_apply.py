"""apply_rope / apply_rope_ against the float64 reference: every layout, dtype, table
shape, memory layout, in place and not, forward and backward, on the compiled CPU kernel
and on the PyTorch path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc.fastpath
from conftest import tolerances
from posenc.encodings.rotary import cpu_kernel
from posenc.encodings.rotary.apply import apply_rope, apply_rope_
from posenc.reference.rope_apply_ref import rope_apply_backward_ref, rope_apply_ref

B, H, T, D = 2, 3, 11, 16
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(params=["kernel", "pytorch", "pytorch-small-chunks"])
def path(request, monkeypatch):
    """Run each test on the compiled kernel and on the PyTorch path (cache-sized chunks,
    and chunks of a few positions)."""
    if request.param == "kernel":
        if cpu_kernel.status() != "compiled C++ kernel":
            pytest.skip(f"CPU kernel: {cpu_kernel.status()}")
    else:
        monkeypatch.setattr(cpu_kernel, "_load", lambda: (None, "switched off by the test"))
    if request.param == "pytorch-small-chunks":
        monkeypatch.setattr(posenc.fastpath, "CHUNK_BYTES", 1600)
    return request.param


def _tables(gen, rotary_dim, table, scale=1.0):
    """cos/sin of random angles, ``[T, R/2]``, ``[B, T, R/2]`` or ``[1, T, R/2]``."""
    shape = {"T": (T,), "BT": (B, T), "1T": (1, T)}[table] + (rotary_dim // 2,)
    angles = 20 * torch.rand(shape, generator=gen, dtype=torch.float64) - 10
    return scale * angles.cos(), scale * angles.sin()


def _x(gen, dtype, layout):
    """``x [B, H, T, D]`` in one of the memory layouts a caller may hand over."""
    if layout == "contiguous":
        x = torch.randn(B, H, T, D, generator=gen)
    elif layout == "projection":  # [B, T, H, D] transposed, as a q/k projection gives
        x = torch.randn(B, T, H, D, generator=gen).transpose(1, 2)
    else:  # "strided": every other feature of a wider tensor (no complex view)
        x = torch.randn(B, H, T, 2 * D + 1, generator=gen)[..., 1::2]
    return x.to(dtype)


def _ref(x, cos, sin, interleaved):
    return torch.from_numpy(
        rope_apply_ref(x.double().numpy(), cos.numpy(), sin.numpy(), interleaved=interleaved)
    )


def _close(actual, expected, dtype):
    torch.testing.assert_close(actual.double(), expected, **tolerances(dtype), check_dtype=False)


CASES = list(
    itertools.product(
        DTYPES, [False, True], [D, 10], ["T", "BT", "1T"], ["contiguous", "projection", "strided"]
    )
)


@pytest.mark.parametrize("dtype,interleaved,rotary_dim,table,layout", CASES)
def test_matches_reference(gen, path, dtype, interleaved, rotary_dim, table, layout):
    x = _x(gen, dtype, layout)
    cos, sin = _tables(gen, rotary_dim, table)
    if dtype != torch.float64:  # RotaryEmbedding hands over float32 tables
        cos, sin = cos.float(), sin.float()
    before = x.clone()

    expected = _ref(x, cos.double(), sin.double(), interleaved)
    out = apply_rope(x, cos, sin, interleaved=interleaved)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(x, before), "apply_rope modified its input"
    _close(out, expected, dtype)

    result = apply_rope_(x, cos, sin, interleaved=interleaved)
    assert result is x
    _close(x, expected, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tables_in_input_dtype_and_scaled(gen, path, dtype, interleaved):
    """cos/sin handed over in x's own dtype, and scaled (attention factor, xPos)."""
    x = _x(gen, dtype, "contiguous")
    cos, sin = _tables(gen, D, "T", scale=1.3)
    cos, sin = cos.to(dtype), sin.to(dtype)
    _close(
        apply_rope(x, cos, sin, interleaved=interleaved),
        _ref(x, cos.double(), sin.double(), interleaved),
        dtype,
    )


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "projection"])
def test_backward_matches_reference(gen, path, dtype, interleaved, inplace, layout):
    x = _x(gen, dtype, layout).requires_grad_()
    cos, sin = _tables(gen, 10, "BT")
    cos, sin = cos.float(), sin.float()
    upstream = torch.randn(x.shape, generator=gen).to(dtype)
    if inplace:
        out = apply_rope_(x * 1, cos, sin, interleaved=interleaved)  # on a non-leaf
    else:
        out = apply_rope(x, cos, sin, interleaved=interleaved)
    (grad,) = torch.autograd.grad(out, x, upstream)
    expected = rope_apply_backward_ref(
        upstream.double().numpy(), cos.numpy(), sin.numpy(), interleaved=interleaved
    )
    _close(grad, torch.from_numpy(expected), dtype)


def test_backward_of_expanded_gradient(gen):
    """A stride-0 upstream gradient (``out.sum()``) goes through the strided kernel."""
    x = _x(gen, torch.float32, "contiguous").requires_grad_()
    cos, sin = _tables(gen, D, "T")
    apply_rope(x, cos.float(), sin.float(), interleaved=True).sum().backward()
    expected = rope_apply_backward_ref(np.ones(x.shape), cos.numpy(), sin.numpy(), interleaved=True)
    _close(x.grad, torch.from_numpy(expected), torch.float32)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_and_gradgradcheck(gen, path, interleaved, inplace):
    """float64 first and second derivatives, in x alone (the custom backward, whose own
    backward is again a rotation) and in x, cos and sin together (learned angles)."""
    x = torch.randn(1, 2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    cos, sin = (t[:1, :3] for t in _tables(gen, 4, "BT"))  # [1, 3, 2]
    if inplace:  # on a non-leaf copy, as autograd's in-place rules require

        def rotate(x, cos, sin):
            return apply_rope_(x * 1, cos, sin, interleaved=interleaved)
    else:

        def rotate(x, cos, sin):
            return apply_rope(x, cos, sin, interleaved=interleaved)

    for check in (torch.autograd.gradcheck, torch.autograd.gradgradcheck):
        assert check(lambda x: rotate(x, cos, sin), (x,))
        angles = (cos.clone().requires_grad_(), sin.clone().requires_grad_())
        assert check(rotate, (x, *angles))
        assert check(lambda *a: rotate(x.detach(), *a), angles)


def _assert_rounded_once(out, expected, dtype):
    """``out`` is ``expected`` (float64) rounded once to ``dtype``: within half a unit in
    its last place, plus the float32 arithmetic's error (a few float32 epsilons)."""
    _, exponent = torch.frexp(expected)
    half_ulp = torch.finfo(dtype).eps * torch.exp2(exponent.double() - 2)
    arithmetic = 8 * torch.finfo(torch.float32).eps * (expected.abs() + 1)
    assert bool(((out.double() - expected).abs() <= half_ulp + arithmetic).all())


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_rotated_in_float32_and_rounded_once(gen, path, dtype, interleaved):
    """Half precision: the exact rotation rounded once to the input's dtype (forward, in
    place and backward), where rotating in the dtype itself would round three times."""
    x = _x(gen, dtype, "contiguous")
    cos, sin = (t.float() for t in _tables(gen, 10, "T"))
    expected = _ref(x, cos.double(), sin.double(), interleaved)
    _assert_rounded_once(apply_rope(x, cos, sin, interleaved=interleaved), expected, dtype)
    _assert_rounded_once(apply_rope_(x.clone(), cos, sin, interleaved=interleaved), expected, dtype)
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(apply_rope(leaf, cos, sin, interleaved=interleaved), leaf, x)
    _assert_rounded_once(grad, _ref(x, cos.double(), -sin.double(), interleaved), dtype)


def test_inplace_on_a_projection_view_backpropagates(gen):
    """apply_rope_ on q viewed out of a projection output: same gradients as apply_rope."""
    weight = torch.randn(D, H * D, generator=gen, dtype=torch.float64, requires_grad=True)
    inputs = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    cos, sin = _tables(gen, D, "BT")
    grads = []
    for rotate in (apply_rope, apply_rope_):
        q = (inputs @ weight).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D] view
        (g,) = torch.autograd.grad(rotate(q, cos, sin).square().sum(), weight)
        grads.append(g)
    torch.testing.assert_close(grads[1], grads[0], **tolerances(torch.float64))


def test_inplace_on_a_view_updates_its_base(gen, path):
    base = torch.randn(B, T, H, D, generator=gen)
    q = base.transpose(1, 2)
    cos, sin = _tables(gen, D, "T")
    expected = _ref(q, cos.float().double(), sin.float().double(), False)
    apply_rope_(q, cos.float(), sin.float())
    _close(base.transpose(1, 2), expected, torch.float32)


@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 9), st.integers(1, 6)),
    half_rot=st.integers(1, 6),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rotations_compose_and_invert(shape, half_rot, interleaved, seed):
    """R(a) R(b) = R(a + b) and R(-a) R(a) = I, in float64, any shape and rotary dim."""
    batch, heads, length, half_dim = shape
    half_rot = min(half_rot, half_dim)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, length, 2 * half_dim, generator=gen, dtype=torch.float64)
    a, b = (torch.randn(length, half_rot, generator=gen, dtype=torch.float64) for _ in range(2))
    twice = apply_rope(
        apply_rope(x, a.cos(), a.sin(), interleaved=interleaved),
        b.cos(),
        b.sin(),
        interleaved=interleaved,
    )
    once = apply_rope(x, (a + b).cos(), (a + b).sin(), interleaved=interleaved)
    torch.testing.assert_close(twice, once, **tolerances(torch.float64))
    back = apply_rope_(
        apply_rope(x, a.cos(), a.sin(), interleaved=interleaved),
        a.cos(),
        -a.sin(),
        interleaved=interleaved,
    )
    torch.testing.assert_close(back, x, **tolerances(torch.float64))


def test_zero_length_and_single_position(gen):
    cos, sin = _tables(gen, D, "T")
    empty = torch.empty(B, H, 0, D)
    assert apply_rope(empty, cos[:0].float(), sin[:0].float()).shape == empty.shape
    x = torch.randn(B, H, 1, D, generator=gen, dtype=torch.float64)  # KV-cache decoding
    _close(apply_rope(x, cos[:1], sin[:1]), _ref(x, cos[:1], sin[:1], False), torch.float64)


@pytest.mark.parametrize(
    "x_shape,cos_shape,match",
    [
        ((B, H, T), (T, 4), "dimensions"),
        ((B, H, T, D), (T, D), "rotate 32 features"),
        ((B, H, T, D), (T + 1, 4), "positions"),
        ((B, H, T, D), (B + 1, T, 4), "batch"),
    ],
)
def test_bad_shapes_raise(x_shape, cos_shape, match):
    x, cos = torch.zeros(x_shape), torch.zeros(cos_shape)
    for fn in (apply_rope, apply_rope_):
        with pytest.raises(ValueError, match=match):
            fn(x, cos, cos)


def test_bad_inputs_raise():
    x, cos = torch.zeros(B, H, T, D), torch.zeros(T, 4)
    with pytest.raises(ValueError, match="same shape"):
        apply_rope(x, cos, torch.zeros(T, 3))
    with pytest.raises(TypeError, match="floating"):
        apply_rope(x.long(), cos, cos)
    with pytest.raises(TypeError, match="real"):
        apply_rope(x, cos.cfloat(), cos.cfloat())
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        apply_rope(x.numpy(), cos, cos)
    with pytest.raises(ValueError, match="meta"):
        apply_rope(x, cos.to("meta"), cos.to("meta"))
    with pytest.raises(ValueError, match="overlapping"):
        apply_rope_(torch.zeros(1, 1, 1, D).expand(B, H, T, D), cos, cos)
