"""apply_rope / apply_rope_ on the inputs that raw-memory kernels get wrong, on the
compiled CPU kernel and on the PyTorch path: lazy negation and zero tensors, sparse and
nested layouts, rotary dim 0, overlapping in-place rows, tables that alias ``x``,
strided views (bit for bit their contiguous copy, and the two paths bit for bit each
other), forward-mode AD and ``torch.func`` transforms, and the Triton entry point's bool
keywords. The numbers are compared with the float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

import posenc.triton
from conftest import tolerances
from posenc.encodings.rotary import cpu_kernel
from posenc.encodings.rotary.apply import apply_rope, apply_rope_
from posenc.reference.rope_apply_ref import rope_apply_ref

B, H, T, D = 2, 3, 5, 8
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(params=["kernel", "pytorch"])
def path(request, monkeypatch):
    if request.param == "kernel" and cpu_kernel.status() != cpu_kernel.ACTIVE:
        pytest.skip(f"CPU kernel: {cpu_kernel.status()}")
    if request.param == "pytorch":
        monkeypatch.setattr(cpu_kernel, "_load", lambda: (None, "switched off by the test"))
    return request.param


def _tables(gen, half=D // 2, dtype=torch.float32):
    angles = 20 * torch.rand(T, half, generator=gen, dtype=torch.float64) - 10
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _reference(x, cos, sin, interleaved=False):
    want = rope_apply_ref(
        x.double().numpy(), cos.double().numpy(), sin.double().numpy(), interleaved=interleaved
    )
    return torch.from_numpy(want)


@pytest.mark.parametrize("interleaved", [False, True])
def test_lazy_negation_is_rotated_as_its_values(gen, path, interleaved):
    x = torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen)
    want = apply_rope(-x, cos, sin, interleaved=interleaved)
    torch.testing.assert_close(
        want.double(), _reference(-x, cos, sin, interleaved), **tolerances(torch.float32)
    )
    assert torch.equal(apply_rope(torch._neg_view(x), cos, sin, interleaved=interleaved), want)
    neg_tables = apply_rope(x, torch._neg_view(-cos), torch._neg_view(-sin))
    assert torch.equal(neg_tables, apply_rope(x, cos, sin))
    y = x.clone()
    view = torch._neg_view(y)  # in place: the values -x rotate, written back through the bit
    assert apply_rope_(view, cos, sin, interleaved=interleaved) is view
    assert torch.equal(view.resolve_neg(), want) and torch.equal(y, -want)


def test_efficient_zero_tensors(gen, path):
    """Zero tensors have no memory: read as zeros, and refused in place (immutable)."""
    cos, sin = _tables(gen)
    zero = torch._efficientzerotensor((B, H, T, D))
    assert torch.equal(apply_rope(zero, cos, sin), torch.zeros(B, H, T, D))
    x = torch.randn(B, H, T, D, generator=gen)
    zero_sin = torch._efficientzerotensor(sin.shape)
    assert torch.equal(apply_rope(x, cos, zero_sin), apply_rope(x, cos, torch.zeros_like(sin)))
    with pytest.raises(ValueError, match="zero tensor"):
        apply_rope_(zero, cos, sin)


@pytest.mark.parametrize("fn", [apply_rope, apply_rope_])
def test_sparse_and_nested_inputs_are_refused_by_layout(gen, fn):
    x = torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen)
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) tensor.*sparse_coo"):
        fn(x.to_sparse(), cos, sin)
    with pytest.raises(TypeError, match=r"cos must be a dense.*sparse_csr"):
        fn(x, cos.to_sparse_csr(), sin)
    nested = torch.nested.nested_tensor([x[0], x[1]])
    with pytest.raises(TypeError, match=r"x must be a dense .*nested"):
        fn(nested, cos, sin)


def test_rotary_dim_zero_rotates_nothing(gen, path):
    x = torch.randn(B, H, T, D, generator=gen)
    empty = torch.zeros(T, 0)
    out = apply_rope(x, empty, empty)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    y = x.clone()
    assert apply_rope_(y, empty, empty) is y and torch.equal(y, x)


@pytest.mark.parametrize(
    ("shape", "strides"),
    [
        ((1, 1, 64, 8), (0, 0, 4, 1)),  # row t shares 4 features with row t + 1
        ((1, 2, 4, 8), (64, 4, 8, 1)),  # heads share rows
        ((2, 1, 3, 8), (0, 24, 8, 1)),  # an expanded batch
    ],
)
def test_inplace_on_overlapping_rows_is_refused_before_writing(gen, path, shape, strides):
    base = torch.randn(1024, generator=gen)
    x = torch.as_strided(base, shape, strides)
    before = base.clone()
    angles = torch.rand(shape[2], 4, generator=gen)
    with pytest.raises(ValueError, match="overlapping"):
        apply_rope_(x, angles.cos(), angles.sin())
    assert torch.equal(base, before)
    torch.testing.assert_close(
        apply_rope(x, angles.cos(), angles.sin()).double(),
        _reference(x, angles.cos(), angles.sin()),
        **tolerances(torch.float32),
    )


def test_tables_aliasing_x_in_place_are_read_as_passed(gen, path):
    """cos/sin views of x's own memory: the rotation is by the angles before the call."""
    x = torch.randn(1, 1, 6, D, generator=gen)
    cos = x.view(-1)[: 6 * D // 2].view(6, D // 2)  # the first rows of x
    sin = torch.rand(6, D // 2, generator=gen)
    want = apply_rope(x.clone(), cos.clone(), sin)
    assert torch.equal(apply_rope_(x, cos, sin), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["feature-step", "transposed", "offset"])
def test_strided_views_are_bit_identical_to_contiguous(gen, path, dtype, interleaved, layout):
    """The guarantee's words, rtol = atol = 0, partial rotary included (R = 6 of D = 8)."""
    if layout == "feature-step":
        x = torch.randn(B, H, T, 2 * D, generator=gen).to(dtype)[..., ::2]
    elif layout == "transposed":
        x = torch.randn(B, T, H, D, generator=gen).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(B * H * T * D + 3, generator=gen).to(dtype)[3:].view(B, H, T, D)
    cos, sin = _tables(
        gen, half=3, dtype=torch.float64 if dtype == torch.float64 else torch.float32
    )
    got = apply_rope(x, cos, sin, interleaved=interleaved)
    want = apply_rope(x.contiguous(), cos, sin, interleaved=interleaved)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    in_place = apply_rope_(x.clone(), cos, sin, interleaved=interleaved)
    torch.testing.assert_close(in_place, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_kernel_and_pytorch_path_give_the_same_bits(gen, monkeypatch, dtype, interleaved):
    if cpu_kernel.status() != cpu_kernel.ACTIVE:
        pytest.skip(f"CPU kernel: {cpu_kernel.status()}")
    x = (300 * torch.randn(B, T, H, D, generator=gen)).to(dtype).transpose(1, 2)
    cos, sin = _tables(gen, half=3)
    kernel = apply_rope(x, cos, sin, interleaved=interleaved)
    monkeypatch.setattr(cpu_kernel, "_load", lambda: (None, "switched off by the test"))
    torch.testing.assert_close(
        apply_rope(x, cos, sin, interleaved=interleaved), kernel, rtol=0, atol=0
    )


def test_forward_mode_ad_carries_the_tangent(gen, path):
    """The rotation is linear in x: the tangent of R x along t is R t."""
    x, t = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen)
    with forward_ad.dual_level():
        out = apply_rope(forward_ad.make_dual(x, t), cos, sin)
        primal, tangent = forward_ad.unpack_dual(out)
    assert tangent is not None
    torch.testing.assert_close(primal, apply_rope(x, cos, sin), rtol=0, atol=0)
    torch.testing.assert_close(
        tangent.double(), _reference(t, cos, sin), **tolerances(torch.float32)
    )


def test_torch_func_transforms(gen, path):
    x, t = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    cos, sin = _tables(gen)

    def rotate(v):
        return apply_rope(v, cos, sin)

    _, tangent = torch.func.jvp(rotate, (x,), (t,))
    torch.testing.assert_close(tangent, rotate(t), **tolerances(torch.float32))
    stacked = torch.stack((x, t))  # [2, B, H, T, D]
    one_by_one = torch.stack((rotate(x), rotate(t)))
    torch.testing.assert_close(torch.func.vmap(rotate)(stacked), one_by_one, rtol=0, atol=0)
    grad = torch.func.grad(lambda v: (rotate(v) * t).sum())(x)
    inverse = apply_rope(t, cos, -sin)  # the transpose of a rotation is its inverse
    torch.testing.assert_close(grad, inverse, **tolerances(torch.float32))


@pytest.mark.parametrize("keyword", ["interleaved", "inplace"])
def test_triton_entry_point_refuses_truthy_non_bools(gen, keyword):
    """Checked before Triton is imported: a string would otherwise pick a layout."""
    x = torch.randn(1, 1, T, D, generator=gen)
    cos, sin = _tables(gen)
    with pytest.raises(TypeError, match=f"{keyword} must be True or False, got 'no'"):
        posenc.triton.apply_rope(x, cos, sin, **{keyword: "no"})


CANONICAL_NAN = {
    torch.float64: 0x7FF8000000000000,
    torch.float32: 0x7FC00000,
    torch.bfloat16: 0x7FC0,
    torch.float16: 0x7E00,
}
BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def _nan_patterns(dtype, gen):
    """NaNs of ``dtype`` of both signs, quiet and signalling: every one for the 16-bit
    dtypes, else 4096 random payloads with the smallest and largest."""
    if dtype.itemsize == 2:
        values = torch.arange(-(2**15), 2**15).to(torch.int16).view(dtype)
        return values[values.isnan()]
    mantissa = 23 if dtype == torch.float32 else 52
    exponent = ((1 << (8 * dtype.itemsize - 1 - mantissa)) - 1) << mantissa
    payload = torch.randint(1, 1 << mantissa, (4096,), generator=gen)
    payload[:2] = torch.tensor([1, (1 << mantissa) - 1])
    sign = torch.randint(0, 2, (4096,), generator=gen) << (8 * dtype.itemsize - 1)
    bits = (exponent | payload | sign).to(BITS[dtype])  # wraps into the signed integer
    assert bits.view(dtype).isnan().all()
    return bits.view(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_a_nan_result_is_the_canonical_nan_on_both_paths(gen, monkeypatch, dtype, interleaved):
    """Every NaN pattern paired with a finite value, an infinity and another NaN, and
    infinities met by a zero cos or sin (inf * 0): NaN exactly where the float64
    reference is NaN, written as the dtype's canonical quiet NaN by the kernel and by
    the PyTorch path, out of place, in place and on a strided view; so the two paths give
    each other's bits."""
    nans = _nan_patterns(dtype, gen)
    n = nans.numel()
    finite = torch.randn(n, generator=gen).to(dtype)
    inf = torch.tensor([float("inf"), float("-inf")]).to(dtype).repeat(n // 2 + 1)[:n]
    shuffled = nans[torch.randperm(n, generator=gen)]
    a, b = torch.cat((nans, finite, nans, inf)), torch.cat((finite, nans, shuffled, finite))
    half = 40  # two 16-pair vector steps and 8 pairs after them
    rows = -(-a.numel() // half)
    pairs = torch.zeros(rows * half, 2, dtype=dtype)
    pairs[: a.numel(), 0], pairs[: a.numel(), 1] = a, b
    pairs = pairs.view(1, 1, rows, half, 2)
    x = pairs.flatten(-2) if interleaved else pairs.transpose(-1, -2).flatten(-2)
    angles = 6.3 * torch.rand(rows, half, generator=gen, dtype=torch.float64)
    cos, sin = angles.cos(), angles.sin()
    cos[:, 0], sin[:, 0], cos[:, 1], sin[:, 1] = 0.0, 1.0, 1.0, 0.0
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = cos.to(compute), sin.to(compute)
    want_nan = _reference(x, cos, sin, interleaved).isnan()
    strided = torch.empty(*x.shape, 2, dtype=dtype)[..., 0]

    def results():
        yield apply_rope(x, cos, sin, interleaved=interleaved)
        yield apply_rope_(x.clone(), cos, sin, interleaved=interleaved)
        yield apply_rope_(strided.copy_(x), cos, sin, interleaved=interleaved)

    paths = ["kernel", "pytorch"] if cpu_kernel.status() == cpu_kernel.ACTIVE else ["pytorch"]
    outputs = []
    for name in paths:
        if name == "pytorch":
            monkeypatch.setattr(cpu_kernel, "_load", lambda: (None, "switched off by the test"))
        outputs += [out.contiguous().view(BITS[dtype]) for out in results()]
    assert want_nan.sum() > 3 * n
    for bits in outputs:
        assert torch.equal(bits.view(dtype).isnan(), want_nan)
        assert (bits[want_nan] == CANONICAL_NAN[dtype]).all()
        assert torch.equal(bits, outputs[0])
